#!/usr/bin/env bash
# The main job: generate a project with the default answers, then train it locally on CPU on local Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export SPARK_LOCAL_IP=127.0.0.1

out=build/quickstart
rm -rf "$out"
echo "==> Generating a project with the default answers into $out/"
.venv/bin/cookiecutter templates/distributed-training --no-input -o "$out"
project=$out/my-training
.venv/bin/python -m pip install --quiet --no-deps -e "$project"

echo "==> Validating the generated bundle (both targets)"
.venv/bin/python -m distributed_training validate "$project"   # the tool, this checkout's package

echo "==> Training it locally: TorchDistributor, 2 CPU processes, local Spark"
.venv/bin/python -m my_training train --engine torch_distributor --local --output-dir "$out/run"
echo "==> Done. Project: $project   Training outputs: $out/run"
