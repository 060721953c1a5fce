"""A training process killed for real in the middle of an epoch; the rerun resumes and ends as an uninterrupted run.

`train --local` runs as a subprocess (its output into a file, so nothing can fill a pipe and hang it), with a
checkpoint every 30 steps of the fare's 100 an epoch; once two checkpoints are complete, rank 1's process gets SIGKILL and the run fails. Then the newest checkpoint is damaged: the DDP state file
truncated, or, under FSDP2 and DeepSpeed, one rank's shard. The rerun must skip it, resume from the one before,
mid-epoch, and end with the weights of an uninterrupted run and, epoch by epoch, its figures; the MLflow run (a local
file store) holds the params, every epoch's metrics and the model. (The fine-tuning task's LoRA run is killed mid-epoch
and resumed as a job: test_jobs_as_the_platform_runs_them.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_training.training.checkpoints import complete_steps, tag_of
from distributed_training.training.strategy import checkpoint_weights

from conftest import FARE, assert_it_learned, environment, metrics_of, output_of, train_command

pytestmark = pytest.mark.engine

EPOCHS = 4
OPTIONS = ["--epochs", str(EPOCHS), "--batch-size", "16", "--keep-checkpoints", "3", "--processes", "2"]


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


def damage(checkpoint: Path, pattern: str) -> None:
    """Truncate the file that `pattern` names: it no longer loads."""
    (victim,) = checkpoint.rglob(pattern)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])


@pytest.mark.parametrize("engine, parallelism, victim", [
    ("torch_distributor", "ddp", "state.pt"),
    ("torch_distributor", "fsdp2", "__1_0.distcp"),  # rank 1's shard of the torch distributed checkpoint
    ("deepspeed", "ddp", "*zero_pp_rank_1_*optim_states.pt"),  # rank 1's shard of the optimizer state
], ids=["ddp", "fsdp2", "deepspeed"])
def test_a_killed_run_resumes_from_its_newest_loadable_checkpoint_and_ends_the_same(tmp_path, engine, parallelism,
                                                                                    victim, monkeypatch, request):
    if engine == "deepspeed":
        request.getfixturevalue("deepspeed_op_built")  # built once per session, not inside the deadline below
    output, log = tmp_path / "run", tmp_path / "first.log"
    checkpoints = output / "checkpoints"
    options = [*OPTIONS, "--parallelism", parallelism, "--checkpoint-every-steps", "30"]
    command = [sys.executable, "-m", "distributed_training", "train", "--engine", engine, "--task", FARE, "--local",
               "--output-dir", str(output), *options]
    with open(log, "w") as sink:
        first = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=environment(),
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 600  # under a minute on 2 quiet cores; 2 busy ones take 3 to 5 times as long
            while len(complete_steps(str(checkpoints))) < 2:
                assert first.poll() is None, "the run ended before its second checkpoint:\n" + log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no second checkpoint in time"
                time.sleep(0.05)
            workers = rank_processes(first.pid, rank=1)
            assert workers, "found no process of rank 1"
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            first.wait(timeout=300)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 1, log.read_text()[-3000:]
    assert "error: training failed in the worker processes" in log.read_text()

    complete = complete_steps(str(checkpoints))
    assert len(complete) >= 2, complete
    damage(checkpoints / tag_of(complete[0]), victim)
    rerun = train_command(output, engine, FARE, *options)
    assert rerun.returncode == 0, output_of(rerun)
    assert f"checkpoint of step {complete[0]} does not load on every rank: skipped" in rerun.stdout
    assert f"resuming from the checkpoint of step {complete[1]}" in rerun.stdout
    resumed = metrics_of(output)
    assert resumed["resumed_from_step"] == complete[1] < resumed["step"]
    assert complete[1] % resumed["updates_per_epoch"] != 0, "the resume should start in the middle of an epoch"

    uninterrupted = train_command(tmp_path / "uninterrupted", engine, FARE, *options)
    assert uninterrupted.returncode == 0, output_of(uninterrupted)
    expected = metrics_of(tmp_path / "uninterrupted")
    for name in ("train_loss", "held_out_loss", "learning_rate", "test_rmse"):
        assert [epoch[name] for epoch in resumed["epochs"]] == pytest.approx(
            [epoch[name] for epoch in expected["epochs"]], rel=1e-5), name
    ours, theirs = (checkpoint_weights(str(folder / "checkpoints"), tag_of(expected["step"]))
                    for folder in (output, tmp_path / "uninterrupted"))
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in theirs) < 1e-6
    assert_it_learned(resumed, FARE)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert_mlflow_holds_the_run(output, resumed, engine)


def assert_mlflow_holds_the_run(output: Path, metrics: dict, engine: str):
    import mlflow
    import numpy as np
    import torch

    store = output / "mlruns"
    mlflow.set_tracking_uri(f"file:{store}")
    mlflow.set_registry_uri(f"file:{store}")
    client = mlflow.MlflowClient()
    run = client.get_run(metrics["mlflow_run_id"])  # one run across the kill: the rerun reopened it
    assert run.data.params["epochs"] == str(EPOCHS) and run.data.params["world_size"] == "2"
    assert run.data.params["engine"] == engine and run.data.params["batch_size"] == "16"
    history = client.get_metric_history(run.info.run_id, "held_out_loss")  # at each epoch's last step
    last_per_step = {point.step: point.value for point in sorted(history, key=lambda point: point.timestamp)}
    assert sorted(last_per_step) == [epoch["step"] for epoch in metrics["epochs"]]
    assert last_per_step[metrics["step"]] == pytest.approx(metrics["final"]["held_out_loss"])

    models = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert [model.source_run_id for model in models] == [run.info.run_id]
    model = mlflow.pytorch.load_model(models[0].model_uri)
    # 3 miles, 15 minutes, at noon on a Wednesday: a metered fare of roughly 2.5 + 7.5 + 5 dollars
    trip = np.array([[3.0, 15.0, np.sin(np.pi), np.cos(np.pi), np.sin(3 * 2 * np.pi / 7),
                      np.cos(3 * 2 * np.pi / 7)]], dtype=np.float32)
    with torch.no_grad():
        fare = float(model(torch.from_numpy(trip))[0])
    assert 10.0 < fare < 22.0, fare
