"""A training process killed for real after a checkpoint; the rerun resumes and ends as an uninterrupted run.

`train --local` runs as a subprocess; once two checkpoints are complete, rank 1's process gets SIGKILL, and the run
fails. The newest checkpoint is then truncated (a damaged file), so the rerun must skip it and resume from the one
before. The rerun's metrics, epoch by epoch, must equal those of an uninterrupted run on the same staged data, and the
MLflow run (a local file store) must hold the params, every epoch's metrics and the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_training.engines.torch_distributor import Placement, distribute
from distributed_training.training.checkpoints import complete_epochs
from distributed_training.training.config import TrainingConfig
from distributed_training.training.staged import StagedData

pytestmark = pytest.mark.engine

SOURCE = Path(__file__).resolve().parents[2] / "src"
EPOCHS, BATCH_SIZE = 6, 16
TRAIN = [sys.executable, "-m", "distributed_training", "train", "--engine", "torch_distributor", "--local",
         "--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE), "--keep-checkpoints", "3"]


def environment():
    paths = [str(SOURCE), os.environ.get("PYTHONPATH")]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    environ.pop("MLFLOW_TRACKING_URI", None)  # --local then tracks into OUTPUT_DIR/mlruns
    return environ


def rank_processes(root_pid: int, rank: int) -> list[int]:
    """The processes under root_pid that run as the given training rank (they carry RANK in their environment)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], list(children.get(root_pid, []))
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        try:
            variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in variables and b"LOCAL_RANK=" + str(rank).encode() in variables:
            found.append(pid)
    return found


def test_a_killed_run_resumes_from_its_newest_loadable_checkpoint_and_ends_the_same(spark, tmp_path, monkeypatch):
    output = tmp_path / "run"
    checkpoints = output / "checkpoints"
    first = subprocess.Popen([*TRAIN, "--output-dir", str(output)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=environment(), start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while len(complete_epochs(str(checkpoints))) < 2:
            assert first.poll() is None, "the run ended before its second checkpoint:\n" + first.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no second checkpoint in time"
            time.sleep(0.05)
        workers = rank_processes(first.pid, rank=1)
        assert workers, "found no process of rank 1"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        first_output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode != 0, first_output[-3000:]
    assert "training failed in the worker processes" in first_output

    complete = complete_epochs(str(checkpoints))
    assert len(complete) >= 2 and complete[0] < EPOCHS, complete
    damaged = checkpoints / f"epoch-{complete[0]:05d}" / "state.pt"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 3])

    rerun = subprocess.run([*TRAIN, "--output-dir", str(output)], capture_output=True, text=True, env=environment(),
                           timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"checkpoint of epoch {complete[0]} does not load on every rank: skipped" in rerun.stdout
    assert f"resuming from the checkpoint of epoch {complete[1]}" in rerun.stdout
    resumed = json.loads((output / "metrics.json").read_text())
    assert resumed["resumed_from_epoch"] == complete[1]

    uninterrupted = distribute(
        TrainingConfig(data=StagedData.load(str(output / "staging")), output_dir=str(tmp_path / "uninterrupted"),
                       epochs=EPOCHS, batch_size=BATCH_SIZE, seed=42),
        Placement(num_processes=2, local_mode=True, use_gpu=False),
    )
    for name in ("train_loss", "test_rmse", "test_mae"):
        assert [epoch[name] for epoch in resumed["epochs"]] == pytest.approx(
            [epoch[name] for epoch in uninterrupted["epochs"]], rel=1e-5), name
    assert resumed["final"]["test_rmse"] * 3 < resumed["final"]["baseline_rmse"]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert_mlflow_holds_the_run(output / "mlruns", resumed)


def assert_mlflow_holds_the_run(store: Path, metrics: dict):
    import mlflow
    import numpy as np

    mlflow.set_tracking_uri(f"file:{store}")
    mlflow.set_registry_uri(f"file:{store}")
    client = mlflow.MlflowClient()
    run = client.get_run(metrics["mlflow_run_id"])  # one run across the kill: the rerun reopened it
    assert run.data.params["epochs"] == str(EPOCHS) and run.data.params["world_size"] == "2"
    assert run.data.params["strategy"] == "ddp" and run.data.params["batch_size"] == str(BATCH_SIZE)
    history = client.get_metric_history(run.info.run_id, "test_rmse")
    last_per_epoch = {point.step: point.value for point in sorted(history, key=lambda point: point.timestamp)}
    assert sorted(last_per_epoch) == list(range(1, EPOCHS + 1))
    assert last_per_epoch[EPOCHS] == pytest.approx(metrics["final"]["test_rmse"])

    models = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert [model.source_run_id for model in models] == [run.info.run_id]
    model = mlflow.pytorch.load_model(models[0].model_uri)
    # distance 3 miles, 15 minutes, at noon on a Wednesday: a metered fare of roughly 2.5 + 7.5 + 5 dollars
    trip = np.array([[3.0, 15.0, np.sin(np.pi), np.cos(np.pi), np.sin(3 * 2 * np.pi / 7), np.cos(3 * 2 * np.pi / 7)]],
                    dtype=np.float32)
    import torch

    with torch.no_grad():
        fare = float(model(torch.from_numpy(trip))[0])
    assert 10.0 < fare < 22.0, fare
