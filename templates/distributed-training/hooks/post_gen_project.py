"""Carry the runtime into the project under its package name: the modules that run on the cluster, the chosen task
as `task.py`, and the launchers of the chosen engines only (`train --engine` offers the engines present)."""

import shutil
from pathlib import Path

SHARED_PACKAGE = Path({{ shared_source | tojson }}) / "distributed_training"
PACKAGE = Path("src") / "{{ cookiecutter.package_name }}"
# The package's runtime is all of it but these: the tooling (it stays with the tool), the built-in tasks and this
# repository's task.py (the chosen task becomes the project's task.py), and the package's __init__.py and __main__.py
# (the project's own come from the template).
NOT_CARRIED = ("tooling", "tasks", "task.py", "__init__.py", "__main__.py", "__pycache__")
CHOSEN = {{ chosen_engines(cookiecutter) | tojson }}
ENGINE_FILES = {
    "torch_distributor": ["resources/train_torch_distributor.job.yml", "notebooks/train_torch_distributor.py"],
    "deepspeed": ["resources/train_deepspeed.job.yml", "notebooks/train_deepspeed.py",
                  f"{PACKAGE}/training/deepspeed_config.py", f"{PACKAGE}/training/deepspeed_strategy.py"],
    "ray": ["resources/train_ray.job.yml", "notebooks/train_ray.py"],
    "spark_ml_connect": ["resources/train_spark_ml_connect.job.yml", "notebooks/train_spark_ml_connect.py",
                         f"{PACKAGE}/engines/least_squares.py"],
}
ignored = shutil.ignore_patterns("__pycache__", "*.pyc")
for source in SHARED_PACKAGE.iterdir():
    if source.name in NOT_CARRIED:
        continue
    if source.is_dir():
        shutil.copytree(source, PACKAGE / source.name, ignore=ignored)
    else:
        shutil.copy2(source, PACKAGE / source.name)
shutil.copy2(SHARED_PACKAGE / "tasks" / "{{ cookiecutter.task }}.py", PACKAGE / "task.py")
for engine, files in ENGINE_FILES.items():
    if engine not in CHOSEN:
        for name in [*files, f"{PACKAGE}/engines/{engine}.py"]:
            Path(name).unlink(missing_ok=True)
if not {"torch_distributor", "deepspeed"} & set(CHOSEN):
    Path(f"{PACKAGE}/engines/distributor.py").unlink()  # the launcher both distributor engines run
{%- if is_serverless(cookiecutter) %}
shutil.rmtree("notebooks")  # a notebook cannot run what a serverless GPU job runs: an ai_runtime_task's nodes
Path("resources/score.job.yml").unlink()  # scoring runs in a classic cluster's Spark executors, which this has not
{%- else %}
Path("src/command.sh").unlink()  # the serverless GPU task's script
{%- endif %}
{%- if not torch_engines(cookiecutter) %}
shutil.rmtree("examples")  # bring-your-own-model: a task for the loop, which a Spark ML project does not run
Path("tests/test_bring_your_own_model.py").unlink()
{%- else %}
# bring-your-own-model: an example of the chosen task's kind (a language model for the tasks on text)
{%- set on_text = cookiecutter.task in ("causal_lm", "fine_tune") %}
Path("examples/{{ 'trip_classifier' if on_text else 'recurrent_language_model' }}.py").unlink()
{%- endif %}
