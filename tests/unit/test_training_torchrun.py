"""The same loop under plain torchrun, two CPU processes, on data staged by Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.training.sample_data import write_sample_trips
from distributed_training.training.staging import stage_training_data

SOURCE = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.engine
def test_torchrun_trains_two_processes_on_staged_data(spark, tmp_path):
    table = write_sample_trips(spark, str(tmp_path / "sample_trips"), rows=1500, seed=2)
    staged = stage_training_data(spark, table, str(tmp_path / "staging"), world_size=2, seed=2)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "-m", "distributed_training.training.train_staged",
         "--staging-dir", staged.directory, "--output-dir", str(tmp_path / "out"), "--epochs", "3"],
        capture_output=True, text=True, env=environment, timeout=180,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["train_rows"] <= staged.train_rows
    assert metrics["final"]["test_rmse"] * 3 < metrics["final"]["baseline_rmse"]
    progress = [line for line in completed.stdout.splitlines() if line.startswith("epoch ")]
    assert len(progress) == 3  # rank 0 alone reports progress, one line per epoch
