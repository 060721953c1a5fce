"""Training runs locally the way the job runs it: `train --engine torch_distributor`, here with 2 CPU processes
on a local Spark session and a sample table of the default table's shape."""

import json
import subprocess
import sys


def test_local_training_loss_goes_down(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "train", "--engine", "torch_distributor", "--local",
         "--processes", "2", "--epochs", "4", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert metrics["world_size"] == 2
    assert losses[-1] < losses[0], losses
    assert metrics["final"]["test_rmse"] < metrics["final"]["baseline_rmse"], metrics["final"]
