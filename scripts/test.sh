#!/usr/bin/env bash
# Run the whole test suite: unit, template, engine (real local Spark and distributor processes) and remote tests.
# DATABRICKS_BUNDLE_SCHEMA=path/to/jsonschema.json (`databricks bundle schema`) adds the JSON-schema tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/python -m pytest "$@"
