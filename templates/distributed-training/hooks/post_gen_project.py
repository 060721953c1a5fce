"""Carry the shared modules in under the project's package name, and drop the files of engines not chosen
(the `train` command offers the engines whose launcher module is present)."""

import shutil
from pathlib import Path

SHARED_PACKAGE = Path({{ shared_source | tojson }}) / "distributed_training"
PACKAGE = Path("src") / "{{ cookiecutter.package_name }}"
CHOSEN = {{ chosen_engines(cookiecutter) | tojson }}
ENGINE_FILES = {
    "torch_distributor": ["resources/train_torch_distributor.job.yml", "notebooks/train_torch_distributor.py",
                          "tests/test_train_torch_distributor.py"],
    "deepspeed": ["resources/train_deepspeed.job.yml", "notebooks/train_deepspeed.py"],
    "ray": ["resources/train_ray.job.yml", "notebooks/train_ray.py"],
    "spark_ml_connect": ["resources/train_spark_ml_connect.job.yml", "notebooks/train_spark_ml_connect.py"],
}

shutil.copytree(SHARED_PACKAGE, PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
for engine, files in ENGINE_FILES.items():
    if engine not in CHOSEN:
        for name in [*files, f"{PACKAGE}/engines/{engine}.py"]:
            Path(name).unlink(missing_ok=True)
