#!/usr/bin/env bash
# The serverless GPU task runs this on every node (its command_path): the training loop under torchrun, one process
# per GPU. The stage task before it staged the data and wrote the run's config into the target's volume; the module
# below finds that config through the MLflow run the platform opens for this task, then starts torchrun.
set -euo pipefail
# The platform unpacks the task's code_source_path (this src/ folder) on each node and names it CODE_SOURCE_PATH.
export PYTHONPATH="${CODE_SOURCE_PATH:+$CODE_SOURCE_PATH:}${PYTHONPATH:-}"
exec python -m {{ cookiecutter.package_name }}.engines.torchrun
