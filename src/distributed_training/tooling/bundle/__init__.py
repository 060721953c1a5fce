"""Load and validate Databricks bundles: `validate.validate_bundle` is the entry point (and the `validate` command)."""
