"""`train`'s options: what cannot work is refused before any Spark or process starts, with the fix."""

from __future__ import annotations

import importlib.util
import os

import pytest

from distributed_training.cli import main
from distributed_training.engines.launch import implemented_engines

TRAIN = ["train", "--engine", "torch_distributor"]


@pytest.mark.parametrize("options, message", [
    (["--local", "--num-nodes", "2"], "--local runs on this machine, one node, but --num-nodes is 2"),
    (["--local", "--gpus-per-node", "4"], "--local trains on CPU processes, but --gpus-per-node is 4"),
    ([], "--output-dir is required on a cluster"),
    (["--output-dir", "dbfs:/tmp/run"], "is a URI, but the training processes read the staged data as files"),
    (["--output-dir", "/Volumes/c/s/v/run", "--processes", "2", "--gpus-per-node", "4"],
     "with GPUs there is one process per GPU"),
    (["--output-dir", "/tmp/run", "--num-nodes", "2", "--gpus-per-node", "4"],
     "--output-dir /tmp/run is not shared between nodes"),
    (["--output-dir", "/Volumes/c/s/v/run", "--handoff-to-torchrun"],
     "--handoff-to-torchrun plans a run on GPU nodes this task does not see: give --gpus-per-node"),
    (["--local", "--command-path", "/Workspace/run/command.sh"],
     "--command-path says where --handoff-to-torchrun writes its command, but the run is not handed off"),
])
def test_settings_that_cannot_work_fail_with_one_clear_paragraph(options, message, capsys):
    assert main([*TRAIN, *options]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1


def test_only_the_torch_loop_is_handed_to_torchrun(capsys):
    assert main(["train", "--engine", "ray", "--local", "--handoff-to-torchrun"]) == 1
    error = capsys.readouterr().err
    assert "--handoff-to-torchrun hands the torch loop to torchrun, but ray does not train with it" in error
    assert "use --engine torch_distributor or deepspeed" in error


def test_bad_numbers_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*TRAIN, "--local", "--epochs", "0"])
    assert exit_.value.code == 2 and "0 is below the minimum, 1" in capsys.readouterr().err


def test_only_engines_with_a_launcher_module_are_offered():
    engines = implemented_engines()
    assert "torch_distributor" in engines
    assert all(importlib.util.find_spec(f"distributed_training.engines.{name}") for name in engines)


def test_on_a_cluster_the_preflight_refuses_gpus_the_driver_does_not_see(spark, tmp_path, capsys):
    """Without --local the session is the active one (here the local test session, which has no GPU)."""
    assert main([*TRAIN, "--output-dir", str(tmp_path), "--gpus-per-node", "1"]) == 1
    error = capsys.readouterr().err
    assert "preflight-gpus-missing" in error and "the driver sees 0 GPU(s)" in error and "fix: " in error
    assert not (tmp_path / "staging").exists()



@pytest.mark.parametrize("uri, folder", [
    ("./mlruns", True), ("/tmp/runs", True), ("file:/tmp/runs", True),
    ("databricks", False), ("http://localhost:5000", False), ("sqlite:///mlflow.db", False),
])
def test_a_tracking_uri_that_names_a_folder_lets_mlflow_3_use_its_file_store(uri, folder, monkeypatch):
    """MLflow 3 refuses a folder of runs unless MLFLOW_ALLOW_FILE_STORE is set; a user who names one wants it."""
    from distributed_training.training.tracking import Tracker, TrackingSettings

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    Tracker(TrackingSettings(experiment="e"), is_main=True, log=lambda message: None)
    assert (os.environ.get("MLFLOW_ALLOW_FILE_STORE") == "true") is folder
