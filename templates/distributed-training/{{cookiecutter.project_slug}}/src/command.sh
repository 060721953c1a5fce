#!/usr/bin/env bash
# The serverless GPU task runs this on every node (its command_path): the training loop under torchrun, one process
# per GPU. The stage task before it staged the data and wrote the run's config into the target's volume; the module
# below finds that config through the MLflow run the platform opens for this task, then starts torchrun.
set -euo pipefail
# The platform unpacks the task's code_source_path (this src/ folder) on each node and names it CODE_SOURCE_PATH.
export PYTHONPATH="${CODE_SOURCE_PATH:+$CODE_SOURCE_PATH:}${PYTHONPATH:-}"
{%- set engine = chosen_engines(cookiecutter)[0] %}
{%- set pinned = versions.packages %}
{%- set needed = [("torch", "torch==" ~ pinned.torch), ("mlflow", "mlflow-skinny==" ~ pinned["mlflow-skinny"])]
                 + ([("deepspeed", "deepspeed==" ~ pinned.deepspeed)] if engine == "deepspeed" else []) %}
# What the {{ engine }} loop imports: a module this node lacks is named, with the requirement that installs it.
for needed in {% for module, requirement in needed %}{{ module }}:{{ requirement }}{{ " " if not loop.last }}{% endfor %}; do
    module=${needed%%:*}
    if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)"; then
        echo "error: the module $module is not installed on this node: add ${needed#*:} to the dependencies of the" \
             "training environment in resources/train_{{ engine }}.job.yml" >&2
        exit 1
    fi
done
exec python -m {{ cookiecutter.package_name }}.engines.torchrun
