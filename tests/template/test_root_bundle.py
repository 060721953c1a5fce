"""The repository's own bundle (databricks.yml, resources/, notebooks/) is the template's output with engine=all: it
must not drift, it validates, and its jobs run this repository's own `train`."""

from __future__ import annotations

import importlib
import runpy
import tomllib
from pathlib import Path

import pytest
import yaml

from distributed_training import config as configuration
from distributed_training.compute.requirements import ENGINES
from distributed_training.engines import available
from distributed_training.task_interface import load_task
from distributed_training.tooling.bundle.validate import validate_bundle

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = {"${var.training_table}": "samples.nyctaxi.trips", "${var.catalog}": "main", "${var.schema}": "default",
            "${resources.volumes.training.name}": "dev_me_distributed_training_training",
            "{{job.parameters.epochs}}": "5", "${workspace.root_path}": "/Workspace/Users/me/.bundle/dt/dev"}


def test_root_bundle_matches_the_template(capsys):
    sync = runpy.run_path(str(ROOT / "scripts" / "sync_root_bundle.py"))
    assert sync["ANSWERS"]["engine"] == "all"
    assert sync["main"](["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_root_bundle_validates(bundle_schema, target):
    findings = validate_bundle(ROOT, targets=[target], schema_path=bundle_schema)
    assert [str(finding) for finding in findings[target] if finding.is_error] == []


def test_root_jobs_run_this_repositorys_train():
    """A job's python_wheel_task calls the wheel's `train` script with its parameters: the script exists, and the
    parameters, deploy-time values filled in, are accepted with this repository's default task."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["train"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    load_task(configuration.DEFAULT_TASK)
    engines = []
    module, _, function = scripts["score"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    for path in sorted((ROOT / "resources").glob("train_*.job.yml")):
        for key, job in yaml.safe_load(path.read_text())["resources"]["jobs"].items():
            [task] = job["tasks"]
            wheel_task = task["python_wheel_task"]
            assert (wheel_task["package_name"], wheel_task["entry_point"]) == ("distributed_training", "train")
            argv = list(wheel_task["parameters"])
            for reference, value in DEPLOYED.items():
                argv = [argument.replace(reference, value) for argument in argv]
            config = configuration.from_args(argv, available())
            configuration.check(config)
            assert (config.engine, config.task) == (key.removeprefix("train_"), configuration.DEFAULT_TASK)
            engines.append(config.engine)
    assert sorted(engines) == sorted(ENGINES)
