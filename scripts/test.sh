#!/usr/bin/env bash
# Run the test suite: unit, template, engine (real local Spark and distributor processes) and remote tests.
#   bash scripts/test.sh          the whole suite (what CI runs); the slowest tests are listed at the end
#   bash scripts/test.sh --fast   every module's unit tests, no engine runs (tests marked `engine`): a few minutes
# Further arguments go to pytest. DATABRICKS_BUNDLE_SCHEMA=path/to/jsonschema.json (`databricks bundle schema`)
# adds the JSON-schema tests. The tests run in one pytest-xdist worker per core (TEST_WORKERS=N for another count,
# 0 for none): an engine test keeps about one core busy, as it waits on JVMs and processes that start one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export SPARK_LOCAL_IP=127.0.0.1
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- -m "not engine" "$@"
fi
exec .venv/bin/python -m pytest --numprocesses "${TEST_WORKERS:-auto}" --dist loadgroup --durations=20 "$@"
