"""TorchDistributor for real: two gloo processes on local Spark, and the `train --local` command end to end.

Quality is asserted against predicting the training mean: the held-out RMSE must be at least 3 times smaller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.engines.settings import LaunchError
from distributed_training.engines.torch_distributor import Placement, distribute
from distributed_training.training.config import TrainingConfig
from distributed_training.training.sample_data import write_sample_trips
from distributed_training.training.staging import stage_training_data

pytestmark = pytest.mark.engine

SOURCE = Path(__file__).resolve().parents[2] / "src"
BETTER_THAN_THE_MEAN = 3.0


@pytest.fixture(scope="module")
def staged(spark, tmp_path_factory):
    """The sample table, staged for two processes."""
    folder = tmp_path_factory.mktemp("torch_distributor")
    table = write_sample_trips(spark, str(folder / "sample_trips"), rows=2000, seed=11)
    return stage_training_data(spark, table, str(folder / "staging"), world_size=2, seed=11)


def assert_it_learned(metrics, output_dir):
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    final = metrics["final"]
    assert metrics["world_size"] == 2 and len(losses) == 4
    assert losses[-1] < losses[0] / 2, losses
    assert final["test_rmse"] * BETTER_THAN_THE_MEAN < final["baseline_rmse"], final
    assert json.loads(Path(output_dir, "metrics.json").read_text()) == metrics


@pytest.mark.parametrize("local_mode", [True, False], ids=["on-the-driver", "on-the-executors"])
def test_two_processes_learn_the_fare(staged, tmp_path, local_mode):
    config = TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=4)
    metrics = distribute(config, Placement(num_processes=2, local_mode=local_mode, use_gpu=False))
    assert_it_learned(metrics, tmp_path)


def test_a_failure_in_the_workers_comes_back_as_one_clear_error(staged, tmp_path):
    config = TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=1)
    with pytest.raises(LaunchError, match=r"rank \d: ValueError: .*2 parquet file\(s\) for 3 processes") as error:
        distribute(config, Placement(num_processes=3, local_mode=True, use_gpu=False))
    assert "\n" not in str(error.value)


def test_train_local_runs_end_to_end_as_a_command(tmp_path):
    """With MLFLOW_TRACKING_URI naming a folder, as a user may set it: MLflow 3 takes it only when told to."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")])),
                   "MLFLOW_TRACKING_URI": str(tmp_path / "tracking")}
    completed = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", "--engine", "torch_distributor", "--local",
         "--output-dir", str(tmp_path), "--epochs", "4"],
        capture_output=True, text=True, env=environment, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"metrics  {tmp_path / 'metrics.json'}" in completed.stdout
    assert (tmp_path / "staging" / "manifest.json").exists() and (tmp_path / "sample_trips").is_dir()
    assert_it_learned(json.loads((tmp_path / "metrics.json").read_text()), tmp_path)
    run_id = json.loads((tmp_path / "metrics.json").read_text())["mlflow_run_id"]
    assert list((tmp_path / "tracking").glob(f"*/{run_id}/metrics/train_loss")), "the run was not tracked there"
