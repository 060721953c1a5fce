"""A run's folder: held while a run trains in it, and a run into a folder whose run finished trains nothing."""

from __future__ import annotations

import json
import time

from distributed_training import config as configuration
from distributed_training.launch import main
from distributed_training.run_folder import finished_metrics
from distributed_training.training.checkpoints import options_identity, refusal_to_resume, tag_of
from distributed_training.training.tracking import experiment_name

from support.runs import FARE, resolved_config


def write_metrics(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    metrics = {"engine": "torch_distributor", "task": FARE, "held_out_loss": 0.5, "baseline_loss": 2.0,
               "step": 30, "updates_per_epoch": 10, "metrics_file": str(folder / "metrics.json"), **fields}
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_a_finished_run_is_one_of_the_same_engine_task_and_at_least_the_steps_asked(tmp_path):
    write_metrics(tmp_path)
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 3)["held_out_loss"] == 0.5
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 2) is not None
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 5) is None  # a longer run goes on
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 5, max_steps=30) is not None  # 30 < 50 steps
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 3, max_steps=31) is not None  # 3 epochs: 30
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 5, max_steps=31) is None  # one more step
    assert finished_metrics(str(tmp_path), "deepspeed", FARE, 3) is None
    assert finished_metrics(str(tmp_path), "torch_distributor", "another.task", 3) is None
    assert finished_metrics(str(tmp_path / "nothing"), "torch_distributor", FARE, 3) is None
    (tmp_path / "metrics.json").write_text("{half a fi")
    assert finished_metrics(str(tmp_path), "torch_distributor", FARE, 3) is None


def test_train_into_a_finished_runs_folder_reports_it_and_starts_nothing(tmp_path, capsys, no_spark_starts):
    write_metrics(tmp_path / "run")
    started = time.perf_counter()
    code = main(["--engine", "torch_distributor", "--task", FARE, "--local", "--epochs", "3",
                 "--output-dir", str(tmp_path / "run")])
    assert code == 0 and time.perf_counter() - started < 60  # a hang's backstop (cold imports: 9 s at a load of 7)
    out = capsys.readouterr().out
    assert "has finished already: held-out loss 0.5000" in out and "give a new --output-dir" in out


def write_checkpoint_marker(folder, config) -> None:
    marker = folder / "checkpoints" / tag_of(5) / "complete.json"
    marker.parent.mkdir(parents=True)
    identity = {**options_identity(config), "source": "a table", "train_rows": 100, "test_rows": 10, "world_size": 2}
    marker.write_text(json.dumps({"step": 5, "epoch": 1, "run_identity": identity}))


def test_a_resume_that_options_alone_refuse_is_refused_before_spark_starts(tmp_path, capsys, no_spark_starts):
    arguments = ["--engine", "torch_distributor", "--task", FARE, "--local", "--output-dir", str(tmp_path / "run")]
    write_checkpoint_marker(tmp_path / "run", configuration.from_args(arguments))
    started = time.perf_counter()
    assert main([*arguments, "--seed", "7", "--batch-size", "16"]) == 1
    assert time.perf_counter() - started < 60  # a hang's backstop: no_spark_starts is the proof
    error = capsys.readouterr().err
    assert "holds the checkpoints of another run (batch_size: 64 -> 16; seed: 42 -> 7)" in error
    assert "--no-resume" in error and not (tmp_path / "run" / "staging").exists()
    # DDP's checkpoints are not FSDP2's (a state file, not a distributed checkpoint): another run too
    fsdp2 = configuration.from_args([*arguments, "--parallelism", "fsdp2"])
    assert "another run (parallelism: 'ddp' -> 'fsdp2')" in refusal_to_resume(fsdp2)
    # what does not change the math never blocks a resume: the budget, the cadences
    relaxed = configuration.from_args([*arguments, "--max-steps", "99", "--epochs", "20", "--log-every-steps", "1",
                                       "--checkpoint-every-steps", "7", "--eval-every-steps", "3"])
    assert refusal_to_resume(relaxed) is None
    assert refusal_to_resume(configuration.from_args([*arguments, "--seed", "7", "--no-resume"])) is None


def test_mlflow_experiments_are_named_without_the_workspace_prefix(tmp_path):
    """${workspace.root_path} starts with /Workspace; MLflow on Databricks names experiments without it, and
    set_experiment with it is reported to fail on every call after the first (mlflow/mlflow#11077)."""
    named = lambda name: experiment_name(resolved_config(tmp_path, mlflow_experiment=name, local=False))  # noqa: E731
    assert named("/Workspace/Users/me@example.com/.bundle/p/dev/p-ray") == "/Users/me@example.com/.bundle/p/dev/p-ray"
    assert named("/Users/me@example.com/exp") == "/Users/me@example.com/exp"
    assert named("/Workspaces-of-mine/exp") == "/Workspaces-of-mine/exp"
    assert named(None) == "/Shared/distributed_training"
