"""Refusals that need more than the options come as soon as what they need is known, and before anything is written:
an accumulation window longer than an epoch once the rows are counted (before any training process starts); a resume
of another run's checkpoints before staging touches that run's staged data (before Spark starts where the options
tell, else right after the config is resolved); what the checkpoints' markers tell (the steps taken, the task, the
optimizer's settings) before Spark starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_training import launch
from distributed_training.task_interface import load_task
from distributed_training.training.checkpoints import options_identity, refusal_to_resume, tag_of

from support.runs import FARE, LANGUAGE

SOURCE = Path(__file__).resolve().parents[2] / "src"
BOUND_S = 300  # a hang's backstop on a loaded machine
TRAIN = ["--engine", "torch_distributor", "--task", FARE, "--local", "--epochs", "1", "--no-tracking"]


def the_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def test_an_accumulation_window_longer_than_an_epoch_is_refused_once_the_rows_are_counted(
        spark, tmp_path, capsys, run_on_the_shared_session):
    table, output_dir = tmp_path / "trips", tmp_path / "run"
    load_task(FARE).sample_table(spark, seed=0, rows=300).coalesce(1).write.parquet(str(table))
    started = time.perf_counter()
    code = launch.main([*TRAIN, "--table", str(table), "--output-dir", str(output_dir), "--grad-accumulation", "100"])
    assert time.perf_counter() - started < BOUND_S
    error = the_error(capsys)
    assert code == 1, error
    assert str(table) in error and "batch(es) of 64 an epoch for each of 2 processes" in error
    assert "fewer than one window of --grad-accumulation 100: lower it or --batch-size" in error
    assert not (output_dir / "staging").exists() and not (output_dir / "metrics.json").exists()


def test_a_resume_whose_source_is_known_once_resolved_is_refused_before_staging(tmp_path, capsys,
                                                                               run_on_the_shared_session):
    """Without --table the source is known once the config is resolved (here, --local's sample table)."""
    output_dir = tmp_path / "run"
    marker = output_dir / "checkpoints" / tag_of(5) / "complete.json"
    marker.parent.mkdir(parents=True)
    config = launch.configuration.from_args([*TRAIN, "--output-dir", str(output_dir)])
    identity = {**options_identity(config), "source": "/elsewhere/trips", "train_rows": 100, "test_rows": 10,
                "world_size": 2}
    marker.write_text(json.dumps({"step": 5, "epoch": 1, "run_identity": identity}))
    assert launch.main([*TRAIN, "--output-dir", str(output_dir)]) == 1
    error = the_error(capsys)
    assert "holds the checkpoints of another run (source: '/elsewhere/trips' -> " in error and "--no-resume" in error
    assert not (output_dir / "staging").exists()


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(path.relative_to(folder)): (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != ".train.lock"}


@pytest.mark.engine
def test_a_resume_across_task_model_or_processes_leaves_the_other_runs_data_untouched(tmp_path, capsys,
                                                                                     no_spark_starts):
    """A finished run of the fare task, then runs into its folder that cannot resume it: each is refused before
    Spark starts (not announced as finished, not staged over), and the run's files stay byte for byte."""
    output_dir = tmp_path / "run"
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    first = subprocess.run([sys.executable, "-m", "distributed_training", "train", *TRAIN, "--output-dir",
                            str(output_dir)], capture_output=True, text=True, env=environment, timeout=BOUND_S)
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(output_dir)
    assert any(name.startswith("staging/") for name in before) and any(name.startswith("checkpoints/")
                                                                      for name in before)
    for change, differs in ((["--hidden-sizes", "32"], "task_options: {'hidden_sizes': [64, 64]} -> "
                                                       "{'hidden_sizes': [32]}"),
                            (["--task", LANGUAGE], f"task: '{FARE}' -> '{LANGUAGE}'"),
                            (["--processes", "1", "--epochs", "2"], "world_size: 2 -> 1")):
        code = launch.main([*TRAIN, "--output-dir", str(output_dir), *change])
        error = the_error(capsys)
        assert code == 1 and differs in error and "--no-resume to start over there" in error, error
    assert snapshot(output_dir) == before


def checkpoint_of(output_dir: Path, step: int, arguments: list[str]) -> None:
    """A complete checkpoint's marker in output_dir, as a run with these arguments would have left it at `step`."""
    config = launch.configuration.from_args([*arguments, "--output-dir", str(output_dir)])
    marker = output_dir / "checkpoints" / tag_of(step) / "complete.json"
    marker.parent.mkdir(parents=True)
    identity = {**options_identity(config), "world_size": config.placement.world_size}
    marker.write_text(json.dumps({"step": step, "epoch": 1, "run_identity": identity}))


def test_a_max_steps_below_the_steps_the_run_took_is_refused_before_spark(tmp_path, capsys, no_spark_starts):
    output_dir = tmp_path / "run"
    checkpoint_of(output_dir, 20, TRAIN)
    assert launch.main([*TRAIN, "--output-dir", str(output_dir), "--max-steps", "19"]) == 1
    assert the_error(capsys) == (f"error: --max-steps 19 is below the 20 steps the run in {output_dir} took already: "
                                 "give a larger --max-steps, or a new --output-dir")
    assert not (output_dir / "staging").exists()
    for max_steps in ("20", "21"):  # the same budget, or a larger one: resumed
        config = launch.configuration.from_args([*TRAIN, "--output-dir", str(output_dir), "--max-steps", max_steps])
        assert refusal_to_resume(config) is None


def test_init_from_a_plain_file_is_refused_before_spark(tmp_path, capsys, no_spark_starts):
    plain = tmp_path / "model.pt"
    plain.write_bytes(b"weights")
    assert launch.main([*TRAIN, "--output-dir", str(tmp_path / "run"), "--init-from", str(plain)]) == 1
    assert the_error(capsys).startswith(f"error: --init-from {plain} holds no complete checkpoint (step-NNNNNNNN "
                                        "with complete.json): give an earlier run's output folder")
    assert not (tmp_path / "run").exists()


def test_init_from_a_checkpoint_of_another_task_is_refused_before_spark(tmp_path, capsys, no_spark_starts):
    checkpoint_of(tmp_path / "language", 7, [*TRAIN, "--task", LANGUAGE])
    assert launch.main([*TRAIN, "--output-dir", str(tmp_path / "run"), "--init-from", str(tmp_path / "language")]) == 1
    assert the_error(capsys) == (f"error: --init-from {tmp_path / 'language' / 'checkpoints' / tag_of(7)} is a "
                                 f"checkpoint of the task {LANGUAGE}, not {FARE}: give a checkpoint of a {FARE} run, "
                                 f"or train that task (--task {LANGUAGE})")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, value, difference", [
    ("--learning-rate", "0.01", "learning_rate: 0.003 -> 0.01"), ("--weight-decay", "0.1", "weight_decay: 0.01 -> 0.1"),
    ("--warmup-fraction", "0.2", "warmup_fraction: 0.05 -> 0.2"), ("--grad-clip", "0", "grad_clip: 1.0 -> 0.0"),
    ("--lr-schedule", "linear", "lr_schedule: 'cosine' -> 'linear'"),
    ("--min-lr-ratio", "0", "min_lr_ratio: 0.1 -> 0.0"),
    ("--adam-betas", "0.9,0.999", "adam_betas: [0.9, 0.95] -> [0.9, 0.999]")])
def test_a_resume_with_other_optimizer_settings_is_refused_before_spark(tmp_path, capsys, no_spark_starts, option,
                                                                        value, difference):
    """The checkpoint's optimizer state and schedule are that run's: another rate, decay, warm-up, schedule, floor or
    clipping would go on along a schedule neither run has (other betas would not even apply: the optimizer's saved
    state brings the old ones back); a new run from its weights (--init-from) can take other settings."""
    output_dir = tmp_path / "run"
    checkpoint_of(output_dir, 20, TRAIN)
    assert launch.main([*TRAIN, "--output-dir", str(output_dir), option, value]) == 1
    assert the_error(capsys) == (f"error: {output_dir} holds the checkpoints of another run ({difference}): give this "
                                 "run its own --output-dir (--init-from that folder starts it from those weights), "
                                 "train with that run's settings to continue it, or --no-resume to start over there")
    assert not (output_dir / "staging").exists()
