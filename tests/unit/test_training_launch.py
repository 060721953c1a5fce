"""`train`'s options: what cannot work is refused before any Spark or process starts, with the fix."""

from __future__ import annotations

import importlib.util

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
])
def test_settings_that_cannot_work_fail_with_one_clear_paragraph(options, message, capsys):
    assert main([*TRAIN, *options]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1


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


@pytest.mark.parametrize("uri, allowed", [
    ("./mlruns", True), ("/tmp/runs", True), ("file:/tmp/runs", True),
    ("databricks", False), ("http://localhost:5000", False), ("sqlite:///mlflow.db", False),
])
def test_a_tracking_uri_that_names_a_folder_lets_mlflow_3_use_its_file_store(uri, allowed, monkeypatch, tmp_path):
    """MLflow 3 refuses a folder of runs unless MLFLOW_ALLOW_FILE_STORE is set; a user who names one wants it."""
    from distributed_training.engines.run_options import tracking
    from distributed_training.engines.settings import RunSettings

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    settings = RunSettings(engine="torch_distributor", local=True, table=None, output_dir=str(tmp_path), num_nodes=1,
                           gpus_per_node=0, processes=2, epochs=1, batch_size=8, learning_rate=0.1, seed=0)
    chosen = tracking(settings)
    assert chosen.tracking_uri is None  # the environment's URI applies
    assert (chosen.environment.get("MLFLOW_ALLOW_FILE_STORE") == "true") is allowed
