"""`train` refuses what cannot work before any worker trains, with the reason: a missing or unusable table, a
checkpoint folder it cannot use, GPUs the machine does not have.

In process against the shared local Spark session where the launcher is the subject; through the command line
once, to see that the user gets one error line and an exit code, not a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_training.data.staging import TableError
from distributed_training.engines import available, engine
from distributed_training.training.checkpoints import CheckpointFolderError
from distributed_training.training.loop import train as train_loop

from support.runs import FARE, resolved_config, staged

SOURCE = Path(__file__).resolve().parents[2] / "src"
FAST = 60.0  # a hang's backstop (a failed Spark read: seconds, even on 2 busy cores); no_training_starts is the proof
TORCH_ENGINES = [name for name in available() if name != "spark_ml_connect"]


@pytest.fixture
def no_training_starts(monkeypatch):
    """The test fails where an engine would start its training processes (its distributor, or Ray), which is what
    failing fast means: on a busy machine wall time alone cannot tell a failed read from a started distributor."""
    from distributed_training.engines import deepspeed, distributor, ray

    def started(*_args, **_kwargs):
        pytest.fail("the engine went on to start its training processes: the table must fail first", pytrace=False)

    monkeypatch.setattr(distributor.TorchDistributorEngine, "distributor", started)
    monkeypatch.setattr(deepspeed.DeepSpeedEngine, "distributor", started)  # its op build comes first in it
    monkeypatch.setattr(ray, "ray_running", started)


@pytest.fixture(scope="module")
def staged_config(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fails_fast")
    config, _ = staged(spark, resolved_config(folder, FARE, processes=1, epochs=1), world_size=1, rows=600)
    return config


def in_folder(config, folder: Path, **overrides):
    """The staged run's config with its output (checkpoints, metrics) in `folder`, its data where it was staged."""
    folder.mkdir(parents=True, exist_ok=True)
    os.symlink(config.staging_dir, folder / "staging")
    return dataclasses.replace(config, output_dir=str(folder), **overrides)


@pytest.mark.parametrize("engine_name", TORCH_ENGINES)
@pytest.mark.parametrize("table, reason", [
    ("{tmp}/no_such_table", "cannot read the parquet path"),
    ("main.no_such_schema.trips", "cannot read the table"),
], ids=["missing-path", "missing-table"])
def test_a_missing_table_fails_fast_naming_it(spark, tmp_path, engine_name, table, reason, no_training_starts):
    table = table.format(tmp=tmp_path)
    config = resolved_config(tmp_path / "out", FARE, engine=engine_name, table=table, processes=1)
    started = time.perf_counter()
    with pytest.raises(TableError, match=reason) as error:
        engine(engine_name).train(spark, config, {})
    assert time.perf_counter() - started < FAST
    assert table in str(error.value) and "--table" in str(error.value)
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_a_table_without_the_tasks_columns_names_them(spark, tmp_path):
    path = str(tmp_path / "wrong_columns")
    spark.range(50).withColumnRenamed("id", "fare").write.parquet(path)
    config = resolved_config(tmp_path / "out", FARE, table=path, processes=1)
    with pytest.raises(TableError, match="trip_distance"):
        engine("torch_distributor").train(spark, config, {})


def test_a_checkpoint_folder_that_is_a_file_fails_before_training(staged_config, tmp_path):
    config = in_folder(staged_config, tmp_path / "run")
    (tmp_path / "run" / "checkpoints").write_text("a file where the checkpoints go")
    with pytest.raises(CheckpointFolderError, match="it is a file, not a folder") as error:
        train_loop(config)
    assert "--output-dir" in str(error.value)
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_more_gpus_than_the_machine_has_fail_in_the_loop_with_the_count(staged_config, tmp_path, monkeypatch):
    """The launcher's preflight refuses such a job on a cluster (tests/unit/test_preflight.py); a process started by
    hand with GPUs asked for meets the same refusal in the loop. CUDA_VISIBLE_DEVICES hides any GPU this machine has,
    so the test means the same on a GPU machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    config = in_folder(staged_config, tmp_path / "run", gpus_per_node=1)
    code = ("import sys, pickle; from distributed_training.training.loop import train; "
            "train(pickle.loads(sys.stdin.buffer.read()))")
    import pickle

    completed = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(config), capture_output=True,
                               timeout=120, env={**os.environ, "PYTHONPATH": str(SOURCE)})
    assert completed.returncode != 0
    assert b"needs a GPU, but this process sees 0" in completed.stderr, completed.stderr[-2000:]


@pytest.mark.engine
def test_the_command_reports_an_unusable_checkpoint_folder_in_one_line(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoints go")
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", "--engine", "torch_distributor", "--local",
         "--output-dir", str(tmp_path), "--epochs", "1", "--no-tracking"],
        capture_output=True, text=True, env=environment, timeout=900,  # a local Spark run: 4 min at a load of 13-20
    )
    assert completed.returncode == 1, completed.stdout[-2000:] + completed.stderr[-2000:]
    error_lines = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "it is a file, not a folder" in error_lines[0], completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr.split(error_lines[0])[-1]
    assert not (tmp_path / "metrics.json").exists()


RANK_ONE_FAILS = ("from distributed_training.tasks.fare_regression import *\n"
                  "from distributed_training.tasks import fare_regression\n"
                  "import os\n\n\n"
                  "def examples(rows, stats, options):\n"
                  "    if os.environ['RANK'] == '1':\n"
                  "        return {}['a key the task forgot']\n"
                  "    return fare_regression.examples(rows, stats, options)\n")


def damaged_file_of_rank_one(data) -> str:
    from distributed_training.data.staged import parquet_files

    path = parquet_files(data.train_dir)[1]
    os.truncate(path, os.path.getsize(path) // 2)
    return f"rank 1: ValueError: the staged file {path} is damaged"


def a_bug_of_rank_one(data) -> str:
    return "rank 1: KeyError: 'a key the task forgot'"


@pytest.mark.engine
@pytest.mark.parametrize("task, break_rank_one, expected", [
    (FARE, damaged_file_of_rank_one, True), ("rank_one_fails", a_bug_of_rank_one, False),
], ids=["an-expected-error", "an-unexpected-exception"])
def test_a_ranks_failure_is_one_line_naming_that_rank_with_its_traceback_only_when_unexpected(
        spark, tmp_path, monkeypatch, task, break_rank_one, expected):
    """Two ranks under torchrun, rank 1 failing: rank 0 then fails in its next collective ("connection closed by
    peer", an echo), and torchrun names whichever rank exited first. The error line names rank 1's own failure, once;
    an expected error (ours, a ValueError) prints no traceback, an unexpected exception rank 1's."""
    from distributed_training.data.staged import StagedData
    from distributed_training.engines.torchrun import hand_off

    (tmp_path / "rank_one_fails.py").write_text(RANK_ONE_FAILS)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = resolved_config(tmp_path / "run", task, processes=2, epochs=1)
    config_path = hand_off(spark, dataclasses.replace(config, table=staged(spark, config, 2, rows=600)[0].table), {})
    words = break_rank_one(StagedData.load(config.staging_dir))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SOURCE)])}
    completed = subprocess.run([sys.executable, "-m", "distributed_training.engines.torchrun", "--config", config_path],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
                               timeout=300)
    output = completed.stdout
    assert completed.returncode == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == output.strip().splitlines()[-1], output[-3000:]
    assert f"training failed in the worker processes (2 CPU process(es) on one node (2 per node)): {words}" in errors[0]
    assert "rank 0" not in errors[0] and "Connection closed" not in errors[0]
    assert output.count(words) == 1, output[-3000:]
    if expected:
        assert "Traceback" not in output, output[-3000:]
    else:
        assert output.count("Traceback") == 1 and "[rank1]: Traceback" in output, output[-3000:]
