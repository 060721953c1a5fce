"""What the engine tests share: the `train` command in a fresh interpreter, and the quality bars."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src"
SUPPORT = Path(__file__).resolve().parents[1] / "support"
FARE = "distributed_training.tasks.fare_regression"
LANGUAGE = "distributed_training.tasks.causal_lm"
FINE_TUNE = "distributed_training.tasks.fine_tune"


def environment(*first_on_path: Path, **extra: str) -> dict[str, str]:
    """This checkout's package importable (after `first_on_path`), no MLflow server: --local tracks into a folder."""
    paths = [*map(str, first_on_path), str(SOURCE), os.environ.get("PYTHONPATH")]
    environ = {name: value for name, value in os.environ.items() if name != "MLFLOW_TRACKING_URI"}
    return {**environ, "PYTHONPATH": os.pathsep.join(filter(None, paths)), "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]), **extra}


def train_command(output_dir: Path, engine: str, task: str, *options: str, env: dict | None = None,
                  timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distributed_training", "train", "--engine", engine, "--task", task,
                           "--local", "--output-dir", str(output_dir), *options],
                          capture_output=True, text=True, env=env or environment(), timeout=timeout)


def score_command(model: Path | str, *options: str, task: str = FARE, env: dict | None = None
                  ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distributed_training", "score", "--model", str(model), "--task",
                           task, "--local", *options], capture_output=True, text=True, env=env or environment(),
                          timeout=600)


def output_of(completed: subprocess.CompletedProcess) -> str:
    return completed.stdout[-3000:] + completed.stderr[-3000:]


def assert_it_learned(metrics: dict, task: str) -> None:
    """The quality bars: the fare's held-out RMSE 3 times below predicting the mean; the language model's held-out
    loss below 0.9 of the unigram model's; a fine-tune's below 0.95 of its base model's. And the training loss went
    down."""
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert losses[-1] < losses[0], losses
    final = metrics["final"]
    if task == FARE:
        assert final["test_rmse"] * 3 < final["baseline_rmse"], final
    elif task == FINE_TUNE:
        assert metrics["held_out_loss"] < 0.95 * metrics["start_held_out_loss"], final
    else:
        assert metrics["held_out_loss"] < 0.9 * metrics["baseline_loss"], final


def metrics_of(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


@pytest.fixture
def staged_run(spark, tmp_path):
    """A resolved config for `task`, its sample table staged (the engine stages it again, as a job does)."""
    from support.runs import resolved_config, staged

    def make(task: str, **overrides):
        return staged(spark, resolved_config(tmp_path / "run", task, **overrides), world_size=2)[0]

    return make
