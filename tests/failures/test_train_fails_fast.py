"""`train` refuses what cannot work before any worker trains, with the reason: a missing or unusable table, a
checkpoint folder it cannot use, GPUs the machine does not have.

In process against the shared local Spark session where the launcher is the subject; through the command line
once, to see that the user gets one error line and an exit code, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_training.engines import launch
from distributed_training.engines.settings import LaunchError, settings_from_args
from distributed_training.training.checkpoints import CheckpointFolderError
from distributed_training.training.config import TrainingConfig
from distributed_training.training.loop import train as train_loop
from distributed_training.training.sample_data import write_sample_trips
from distributed_training.training.staging import stage_training_data

SOURCE = Path(__file__).resolve().parents[2] / "src"
FAST = 30.0  # seconds: failing before any distributor starts takes a Spark read at most


def settings(tmp_path, engine: str, table: str):
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return settings_from_args(parser.parse_args(
        ["--engine", engine, "--local", "--table", table, "--output-dir", str(tmp_path / "out"), "--epochs", "1",
         "--no-tracking"]))


@pytest.fixture(scope="module")
def staged(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fails_fast")
    table = write_sample_trips(spark, str(folder / "trips"), rows=600, seed=5)
    return stage_training_data(spark, table, str(folder / "staging"), world_size=1, seed=5)


@pytest.mark.parametrize("engine", launch.implemented_engines())
@pytest.mark.parametrize("table, reason", [
    ("{tmp}/no_such_table", "cannot read the parquet path"),
    ("main.no_such_schema.trips", "cannot read the table"),
], ids=["missing-path", "missing-table"])
def test_a_missing_table_fails_fast_naming_it(spark, tmp_path, engine, table, reason):
    table = table.format(tmp=tmp_path)
    module = importlib.import_module(f"distributed_training.engines.{engine}")
    started = time.perf_counter()
    with pytest.raises(LaunchError, match=reason) as error:
        module.train(spark, settings(tmp_path, engine, table))
    assert time.perf_counter() - started < FAST
    assert table in str(error.value) and "--table" in str(error.value)


def test_a_table_without_the_feature_columns_names_them(spark, tmp_path):
    path = str(tmp_path / "wrong_columns")
    spark.range(50).withColumnRenamed("id", "fare").write.parquet(path)
    module = importlib.import_module("distributed_training.engines.torch_distributor")
    with pytest.raises(LaunchError, match="lacks the column.*trip_distance.*fare_amount"):
        module.train(spark, settings(tmp_path, "torch_distributor", path))


def test_a_checkpoint_folder_that_is_a_file_fails_before_training(staged, tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoints go")
    config = TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=1)
    with pytest.raises(CheckpointFolderError, match="it is a file, not a folder") as error:
        train_loop(config)
    assert "--output-dir" in str(error.value)
    assert not (tmp_path / "metrics.json").exists()


def test_a_checkpoint_folder_that_cannot_be_created_fails_before_training(staged, tmp_path):
    (tmp_path / "blocked").write_text("")
    config = TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=1,
                            checkpoint_dir=str(tmp_path / "blocked" / "checkpoints"))
    with pytest.raises(CheckpointFolderError, match="cannot create the checkpoint folder"):
        train_loop(config)


def test_more_gpus_than_the_machine_has_fail_in_the_loop_with_the_count(staged, tmp_path):
    """The launcher's preflight refuses such a job on a cluster (tests/unit/test_training_launch.py); a process
    started by hand with --gpu meets the same refusal in the loop."""
    config = TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=1, use_gpu=True)
    with pytest.raises(RuntimeError, match=r"needs a GPU, but this process sees 0"):
        train_loop(config)


@pytest.mark.engine
def test_the_command_reports_an_unusable_checkpoint_folder_in_one_line(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoints go")
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", "--engine", "torch_distributor", "--local",
         "--output-dir", str(tmp_path), "--epochs", "1", "--no-tracking"],
        capture_output=True, text=True, env=environment, timeout=300,
    )
    assert completed.returncode == 1, completed.stdout[-2000:] + completed.stderr[-2000:]
    error_lines = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "it is a file, not a folder" in error_lines[0], completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr.split(error_lines[0])[-1]
    assert not (tmp_path / "metrics.json").exists()
