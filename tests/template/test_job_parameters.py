"""Every generated job passes parameters that the `train` entry point accepts: template and CLI cannot drift."""

from __future__ import annotations

import re

import pytest
import yaml

from distributed_training.cli import build_parser
from distributed_training.engines.settings import settings_from_args

# Deploy-time values, as the CLI and the Jobs service would fill them in.
DEPLOYED = {"${var.training_table}": "samples.nyctaxi.trips", "${var.catalog}": "main", "${var.schema}": "default",
            "${resources.volumes.training.name}": "dev_me_my_training_training", "{{job.parameters.epochs}}": "5",
            "${workspace.current_user.userName}": "me@example.com", "${bundle.name}": "my-training"}


def deployed(parameter: str) -> str:
    for reference, value in DEPLOYED.items():
        parameter = parameter.replace(reference, value)
    assert not re.search(r"\$\{|\{\{", parameter), f"{parameter}: a reference this test does not know"
    return parameter


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_job_parameter_list_is_accepted_by_train(render, num_workers):
    project = render(cloud="aws", engine="all", num_workers=num_workers)
    for path in sorted((project / "resources").glob("*.job.yml")):
        for key, job in yaml.safe_load(path.read_text())["resources"]["jobs"].items():
            wheel_task = job["tasks"][-1]["python_wheel_task"]
            assert (wheel_task["entry_point"], wheel_task["package_name"]) == ("train", "my_training")
            args = build_parser().parse_args(["train", *map(deployed, wheel_task["parameters"])])
            settings = settings_from_args(args)
            assert settings.engine == key.removeprefix("train_")
            assert settings.output_dir.startswith("/Volumes/main/default/")
            assert settings.mlflow_experiment == "/Users/me@example.com/my-training"
            if key == "train_spark_ml_connect":
                # The Standard runtime has no torch for pyspark.ml.connect; Spark spreads over the executors itself.
                assert settings.spark_ml_api == "classic"
            else:
                assert settings.num_nodes == max(num_workers, 1)
