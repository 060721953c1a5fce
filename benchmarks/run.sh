#!/usr/bin/env bash
# Every benchmark, one table: bash benchmarks/run.sh [--quick] [--only SECTION ...] [--output FILE] (--help lists them)
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARK_LOCAL_IP=127.0.0.1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m benchmarks "$@"
