"""The serverless GPU job's two steps, here on CPU. `train --handoff-to-torchrun` stages the table and writes the run's
config and a command with torch and DeepSpeed unimportable (serverless compute has neither); then the command trains
under torchrun (what the GPU task runs on every node). And the GPU side finds its config through MLflow, as a node
of an ai_runtime_task does, or says what it misses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distributed_training import config as configuration
from distributed_training.engines import LaunchError, torchrun
from distributed_training.engines.torchrun import config_of_platform_run, config_tag, configs_by_job_run, \
    torchrun_command
from distributed_training.run_folder import held
from distributed_training.training.checkpoints import tag_of

from support.fake_workspace import DUMMY_TOKEN, FakeWorkspace

from conftest import FARE, LANGUAGE, SUPPORT, assert_it_learned, environment, metrics_of, output_of, train_command


@pytest.mark.engine
@pytest.mark.parametrize("engine, task, parallelism", [("torch_distributor", FARE, "ddp"),
                                                       ("torch_distributor", LANGUAGE, "fsdp2"),
                                                       ("deepspeed", LANGUAGE, "ddp")],
                         ids=["fare-ddp", "language-model-fsdp2", "language-model-deepspeed"])
def test_the_stage_step_needs_no_torch_and_its_command_trains(tmp_path, engine, task, parallelism, request):
    if engine == "deepspeed":
        request.getfixturevalue("deepspeed_op_built")  # built once per session, not inside the bounds below
    output = tmp_path / "run"
    without_torch = environment(SUPPORT / "without_torch")
    staged = train_command(output, engine, task, "--handoff-to-torchrun", "--epochs", "3", "--parallelism",
                           parallelism, env=without_torch)
    assert staged.returncode == 0, output_of(staged)
    proof = subprocess.run([sys.executable, "-c", "import torch"], env=without_torch, capture_output=True)
    assert proof.returncode != 0, "torch was importable: the test proves nothing"
    assert not (output / "metrics.json").exists(), "the stage step must not train"
    written = json.loads((output / "torchrun" / "config.json").read_text())
    assert (written["engine"], written["task"], written["parallelism"], written["handoff_to_torchrun"]) == (
        engine, task, parallelism, True)

    trained = subprocess.run(["bash", str(output / "torchrun" / "command.sh")], cwd=tmp_path, capture_output=True,
                             text=True, env=environment(), timeout=600)
    assert trained.returncode == 0, output_of(trained)
    metrics = metrics_of(output)
    assert metrics["world_size"] == 2 and metrics["engine"] == engine
    assert_it_learned(metrics, task)
    final = output / "checkpoints" / tag_of(metrics["step"])
    assert (final / "complete.json").exists()
    assert (final / ".metadata").exists() == (parallelism == "fsdp2")  # FSDP2's checkpoints are DCP folders


def test_credentials_never_land_in_the_config_file(tmp_path, monkeypatch):
    """The stage task hands MLflow credentials to the processes it starts as an argument; the config file it writes
    for other machines holds none, even when the environment has them."""
    from distributed_training.engines import torchrun

    monkeypatch.setenv("DATABRICKS_TOKEN", "dapi-secret-token")
    config = configuration.from_args(["--engine", "torch_distributor", "--task", FARE, "--local",
                                      "--output-dir", str(tmp_path)])
    monkeypatch.setattr(torchrun, "stage", lambda *args: None)
    torchrun.hand_off(None, config, {"DATABRICKS_HOST": "https://x", "DATABRICKS_TOKEN": "dapi-secret-token"})
    written = (tmp_path / "torchrun" / "config.json").read_text() + (tmp_path / "torchrun" / "command.sh").read_text()
    assert "dapi-secret-token" not in written and "DATABRICKS_HOST" not in written


def gpu_config(tmp_path, nodes):
    return configuration.Config(engine="deepspeed", task=FARE, output_dir=str(tmp_path), num_nodes=nodes,
                                gpus_per_node=8, task_options=None)


def test_one_node_is_standalone_and_several_meet_at_the_first_node(tmp_path, monkeypatch):
    one = torchrun_command(gpu_config(tmp_path, 1), "/v/config.json")
    assert one[1:6] == ["-m", "torch.distributed.run", "--nproc-per-node", "8", "--standalone"]
    assert one[-4:] == ["distributed_training.engines.torchrun", "--worker", "--config", "/v/config.json"]
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.4")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    several = torchrun_command(gpu_config(tmp_path, 2), "/v/config.json")
    assert several[5:13] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.4", "--master-port",
                             "29400"]
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(LaunchError, match="MASTER_ADDR not set: this 2-node run needs"):
        torchrun_command(gpu_config(tmp_path, 2), "/v/config.json")


def test_a_node_takes_the_config_of_its_own_job_run_which_the_jobs_api_names(tmp_path, monkeypatch):
    """The stage task of each job run names its config in the experiment under the run's id; a node of the GPU task
    asks the Jobs API which job run the MLflow run the platform opened for it belongs to. A FakeWorkspace stands in
    for the workspace's Jobs API 2.2 (real databricks-sdk over HTTP), a local file store for its MLflow."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    with pytest.raises(LaunchError, match="MLFLOW_RUN_ID is not set"):
        config_of_platform_run()
    client = mlflow.MlflowClient()
    experiment = mlflow.set_experiment("stage-and-train").experiment_id
    attempt = client.create_run(experiment).info.run_id  # what the platform opens for the GPU task's attempt
    monkeypatch.setenv("MLFLOW_RUN_ID", attempt)
    with pytest.raises(LaunchError, match="names no run config"):
        config_of_platform_run()
    for job_run in ("101", "102"):
        client.set_experiment_tag(experiment, config_tag(job_run), f"/Volumes/c/s/v/{job_run}/torchrun/config.json")
    with FakeWorkspace() as workspace:
        monkeypatch.setenv("DATABRICKS_HOST", workspace.url)
        monkeypatch.setenv("DATABRICKS_TOKEN", DUMMY_TOKEN)
        for job_run, gpu_task, mlflow_run in ((101, 202, attempt), (102, 204, "a-later-runs-attempt")):
            workspace.record_run({"job_id": 1, "run_id": job_run, "tasks": [
                {"task_key": "stage", "run_id": gpu_task - 1, "python_wheel_task": {}},
                {"task_key": "train", "run_id": gpu_task, "ai_runtime_task": {}}]})
            workspace.record_output(gpu_task, {"ai_runtime_task_output": {"mlflow_run_id": mlflow_run}})
        # A repair of the earlier run, after a later one: the newer tag is not this node's.
        assert config_of_platform_run() == "/Volumes/c/s/v/101/torchrun/config.json"
        client.set_experiment_tag(experiment, config_tag("99"), "/Volumes/c/s/v/99/torchrun/config.json")  # deleted
        workspace.record_output(202, {"ai_runtime_task_output": {"mlflow_run_id": "another-attempt"}})
        with pytest.raises(LaunchError, match=f"none of the job runs whose stage task named a config \\(102, 101, 99\\) "
                                              f"runs the MLflow run {attempt}"):
            config_of_platform_run()
        workspace.fail_next("/api/2.2/jobs/runs/get", 403)
        with pytest.raises(LaunchError, match="the Jobs API refused to show job run 102 .*needs CAN VIEW"):
            config_of_platform_run()
    assert configs_by_job_run({config_tag("9"): "", config_tag("100"): "", config_tag("10"): "", "other": ""}) == [
        "100", "10", "9"]


def test_a_second_command_into_a_folder_a_run_holds_is_refused(tmp_path, capsys):
    """The hand-off's command takes the run's folder as `train` does (and torchrun keeps it until it ends)."""
    config = configuration.from_args(["--engine", "torch_distributor", "--task", FARE, "--local",
                                      "--output-dir", str(tmp_path)])
    path = tmp_path / "torchrun" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(configuration.to_json(config)))
    with held(str(tmp_path)):
        assert torchrun.main(["--config", str(path)]) == 1
    assert "is in use by another training run" in capsys.readouterr().err
