"""The bundle validates offline, for both targets: typed resources, references, the compute guards over this
project's node-type catalog, and the CLI's JSON schema when DATABRICKS_BUNDLE_SCHEMA names one (the output of
`databricks bundle schema`). The validator is the template's tooling, installed with the `test` extra."""

import os

import pytest

from distributed_training.tooling.bundle.validate import validate_bundle

from conftest import PROJECT


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_bundle_validates(target):
    findings = validate_bundle(PROJECT, targets=[target], schema_path=os.environ.get("DATABRICKS_BUNDLE_SCHEMA"))
    assert [str(finding) for finding in findings[target] if finding.is_error] == []
