"""A rendered bundle's jobs, run on this machine the way the platform runs them (tests/support/local_platform.py):
each run its own job run id and folder; a new run trains from the start, a retry and a repair resume their own run
and end where an uninterrupted run ends; the serverless GPU job's two tasks meet in their own run's folder; the jobs
of a project whose task.py was replaced still run; and the fine-tuning task's jobs fine-tune the base model the bundle
variable names (the session's small pretrained Llama), classic and serverless, with LoRA or in full.

The kills are SIGKILL to a task's process and every process it started (a lost node), once the run has a complete
checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from distributed_training.training.checkpoints import complete_steps

from support.fake_workspace import FakeWorkspace
from support.local_platform import SUCCESS, Interrupt, LocalPlatform, sample_tables

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]
EPOCHS = {"epochs": "2"}
# Runs that are killed once their first checkpoint is complete: enough epochs after it that the kill lands mid-run
# even on a busy machine (an epoch of the sample takes about 0.2 s on 2 quiet cores).
KILLED_EPOCHS = {"epochs": "8"}
TORCH_ENGINES = ("torch_distributor", "deepspeed", "ray")


@pytest.fixture(scope="module")
def workspace():
    with FakeWorkspace() as fake:
        yield fake


@pytest.fixture(scope="module")
def platform_of(spark, workspace, render_into, tmp_path_factory, pretrained):
    """A LocalPlatform for a project rendered from these answers (one per answers, for the module), its tables the
    project's own samples, and for the fine-tuning task the session's small pretrained Llama as the base_model
    variable; `replace_task` copies that file over the project's task.py first, and `train_options` (by engine) are
    added to that engine's job's `train` arguments, as a user adds a task's option to a job."""
    platforms = {}

    def make(replace_task: str | None = None, train_options: dict[str, tuple[str, ...]] | None = None,
             **answers) -> LocalPlatform:
        key = (replace_task, tuple(sorted((train_options or {}).items())), tuple(sorted(answers.items())))
        if key not in platforms:
            root = tmp_path_factory.mktemp("platform")
            project = render_into(root / "out", **answers)
            if replace_task:
                shutil.copy(project / replace_task, project / "src" / "my_training" / "task.py")
            for engine, options in (train_options or {}).items():
                job_file = project / "resources" / f"train_{engine}.job.yml"
                job_file.write_text(with_train_options(job_file.read_text(), options))
            variables = sample_tables(spark, project, root / "tables")
            if answers.get("task") == "fine_tune":
                variables["base_model"] = pretrained("llama")
            platforms[key] = LocalPlatform(project, root / "workspace", workspace, variables=variables)
        return platforms[key]

    return make


def with_train_options(job_file: str, options: tuple[str, ...]) -> str:
    """A job file's text with `options` before the --epochs of its `train` arguments."""
    return re.sub(r"^( *)- --epochs$", lambda found: "".join(f"{found[1]}- {option}\n" for option in options)
                  + found[0], job_file, flags=re.MULTILINE)


def run_folder(platform: LocalPlatform, engine: str, run) -> Path:
    volume = platform.tree["resources"]["volumes"]["training"]["name"]
    return platform.local_path(f"/Volumes/main/default/{volume}/{engine}/{run.run_id}")


def metrics_of(platform: LocalPlatform, engine: str, run) -> dict:
    return json.loads((run_folder(platform, engine, run) / "metrics.json").read_text())


def first_checkpoint_done(platform: LocalPlatform, engine: str):
    """True once the run has a complete checkpoint (older ones are pruned: not the first one by name)."""
    return lambda run: bool(complete_steps(str(run_folder(platform, engine, run) / "checkpoints")))


def mlflow_run(platform: LocalPlatform, run_id: str):
    return platform.mlflow().get_run(run_id)


def assert_succeeded(run) -> None:
    assert run.state == SUCCESS, run.report()


@pytest.mark.parametrize("engine", [*TORCH_ENGINES, "spark_ml_connect"])
def test_a_second_run_of_a_job_trains_again_in_a_folder_and_mlflow_run_of_its_own(platform_of, engine, request):
    if engine == "deepspeed":
        request.getfixturevalue("deepspeed_op_built")  # built once per session, not inside a task's bound
    platform = platform_of(engine="all")
    first = platform.run_job(f"train_{engine}", EPOCHS)
    assert_succeeded(first)
    second = platform.run_job(f"train_{engine}", EPOCHS)
    assert_succeeded(second)
    assert second.run_id != first.run_id
    metrics = [metrics_of(platform, engine, run) for run in (first, second)]
    assert metrics[0]["mlflow_run_id"] != metrics[1]["mlflow_run_id"]
    for run, run_metrics in zip((first, second), metrics):
        assert run_metrics["metrics_file"] == str(run_folder(platform, engine, run) / "metrics.json")
        mlflow = mlflow_run(platform, run_metrics["mlflow_run_id"])
        assert mlflow.info.status == "FINISHED"
        if engine != "spark_ml_connect":  # the loop: every epoch trained, nothing resumed, the job run named
            assert [epoch["epoch"] for epoch in run_metrics["epochs"]] == [1, 2]
            assert run_metrics["resumed_from_step"] is None
            assert run_metrics["job_run_id"] == str(run.run_id) == mlflow.data.tags["job_run_id"]
    if engine != "spark_ml_connect":  # same data, seed and settings: the same result, trained twice
        assert metrics[1]["held_out_loss"] == pytest.approx(metrics[0]["held_out_loss"], rel=1e-5)


def resumed_mid_run(metrics: dict) -> bool:
    return 1 <= metrics["resumed_from_step"] < metrics["step"]


def test_a_retry_and_a_repair_resume_their_own_run_and_end_as_an_uninterrupted_one(platform_of):
    engine = "torch_distributor"
    platform = platform_of(engine="all")
    uninterrupted = platform.run_job(f"train_{engine}", KILLED_EPOCHS)
    assert_succeeded(uninterrupted)
    reference = metrics_of(platform, engine, uninterrupted)

    retried = platform.run_job(f"train_{engine}", KILLED_EPOCHS,
                               interrupt=Interrupt("train", first_checkpoint_done(platform, engine), attempts=(0,)))
    assert [attempt.state for attempt in retried.attempts] == ["FAILED", SUCCESS], retried.report()
    metrics = metrics_of(platform, engine, retried)
    assert resumed_mid_run(metrics), metrics["resumed_from_step"]
    assert "using the data staged at" in retried.attempts[1].output  # staged once: the retry stages nothing
    assert metrics["held_out_loss"] == pytest.approx(reference["held_out_loss"], rel=1e-5)

    repaired = platform.run_job(f"train_{engine}", KILLED_EPOCHS,  # killed in the first attempt and in its retry
                                interrupt=Interrupt("train", first_checkpoint_done(platform, engine), attempts=(0, 1)))
    assert [attempt.state for attempt in repaired.attempts] == ["FAILED", "FAILED"], repaired.report()
    assert not (run_folder(platform, engine, repaired) / "metrics.json").exists()
    platform.repair(repaired)
    assert_succeeded(repaired)
    assert repaired.repair_count == 1
    metrics = metrics_of(platform, engine, repaired)
    assert resumed_mid_run(metrics) and metrics["job_run_id"] == str(repaired.run_id)
    assert metrics["held_out_loss"] == pytest.approx(reference["held_out_loss"], rel=1e-5)
    assert "using the data staged at" in repaired.latest("train").output

    again = platform.repair(repaired, tasks=["train"])  # rerun a task that finished: nothing to train or change
    assert again.latest("train").state == SUCCESS and "has finished already" in again.latest("train").output
    assert metrics_of(platform, engine, repaired) == metrics


def test_the_score_job_scores_the_table_with_a_training_runs_model_and_replaces_its_output(platform_of):
    """The training job, then the score job given that run's id: every row of the training table, scored with the
    run's model where the task keeps the row. A second run replaces the output; given the run's MLflow model instead,
    the same scores; a run without a training run's id or a model fails in one line."""
    platform = platform_of(engine="all")
    trained = platform.run_job("train_torch_distributor", EPOCHS)
    assert_succeeded(trained)
    output = "/Volumes/main/default/scores/fares"
    for _ in range(2):
        scored = platform.run_job("score", {"train_run_id": str(trained.run_id), "output_table": output})
        assert_succeeded(scored)
    staged = json.loads((run_folder(platform, "torch_distributor", trained) / "staging" / "manifest.json").read_text())
    rows = pq.read_table(platform.local_path(output)).to_pandas()
    assert len(rows) == pq.read_table(staged["source"], columns=[]).num_rows  # every row of the table once
    assert rows["predicted_fare"].notna().sum() == staged["train_rows"] + staged["test_rows"]  # where the task keeps it
    assert [path.name for path in platform.local_path(output).parent.iterdir()] == ["fares"]
    # By the run's MLflow model instead of its job run's id: the same scores
    mlflow_model = f"runs:/{metrics_of(platform, 'torch_distributor', trained)['mlflow_run_id']}/model"
    by_model = platform.run_job("score", {"model": mlflow_model, "output_table": f"{output}_by_model"})
    assert_succeeded(by_model)
    in_order = lambda table: table.sort_values(list(table.columns)).reset_index(drop=True)  # noqa: E731
    assert in_order(pq.read_table(platform.local_path(f"{output}_by_model")).to_pandas()).equals(in_order(rows))

    unnamed = platform.run_job("score", {"output_table": output})
    assert unnamed.latest("score").state == "FAILED", unnamed.report()
    error = unnamed.latest("score").output.strip().splitlines()[-1]
    assert error.startswith("error: --model ") and "holds no finished training run" in error, unnamed.report()


@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed"])
def test_the_serverless_job_stages_and_trains_in_its_own_run_and_a_repair_after_a_later_run_takes_its_own(
        platform_of, engine, request):
    if engine == "deepspeed":
        request.getfixturevalue("deepspeed_op_built")
    platform = platform_of(compute="serverless_gpu", engine=engine)
    killed = Interrupt("train", first_checkpoint_done(platform, engine), attempts=(0, 1))
    first = platform.run_job(f"train_{engine}", KILLED_EPOCHS, interrupt=killed)  # its GPU task killed, and its retry
    assert [(attempt.task_key, attempt.state) for attempt in first.attempts] == [
        ("stage", SUCCESS), ("train", "FAILED"), ("train", "FAILED")], first.report()
    second = platform.run_job(f"train_{engine}", KILLED_EPOCHS)
    assert_succeeded(second)
    second_metrics = metrics_of(platform, engine, second)
    assert second_metrics["resumed_from_step"] is None and second_metrics["job_run_id"] == str(second.run_id)

    platform.repair(first)  # after the later run: it must take its own run's config, data and checkpoints
    assert_succeeded(first)
    assert [attempt.task_key for attempt in first.attempts] == ["stage", "train", "train", "train"]
    metrics = metrics_of(platform, engine, first)
    assert metrics["job_run_id"] == str(first.run_id) and resumed_mid_run(metrics)
    assert metrics["held_out_loss"] == pytest.approx(second_metrics["held_out_loss"], rel=1e-5)
    assert metrics_of(platform, engine, second) == second_metrics  # the later run's folder is untouched
    # Each attempt of the GPU task logged into the MLflow run the platform opened for it.
    assert mlflow_run(platform, metrics["mlflow_run_id"]).data.tags["job_run_id"] == str(first.run_id)


def test_with_task_py_replaced_by_the_example_every_job_runs_and_validate_names_a_task_option_left_behind(
        platform_of, deepspeed_op_built):
    platform = platform_of(replace_task="examples/recurrent_language_model.py", engine="all", task="causal_lm")
    for engine in (*TORCH_ENGINES, "spark_ml_connect"):
        run = platform.run_job(f"train_{engine}", EPOCHS)
        assert_succeeded(run)
        if engine != "spark_ml_connect":  # the example trained: its metrics, without the built-in's bits per byte
            final = metrics_of(platform, engine, run)["final"]
            assert "perplexity" in final and "bits_per_byte" not in final
    project = platform.project
    validate = [sys.executable, "-m", "distributed_training", "validate", str(project)]
    assert subprocess.run(validate, capture_output=True, text=True).returncode == 0
    job_file = project / "resources" / "train_deepspeed.job.yml"
    job_file.write_text(job_file.read_text().replace("- --epochs\n", "- --model-size\n              - small\n"
                                                                      "              - --epochs\n"))
    result = subprocess.run(validate, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout
    assert "[unknown-train-option] job train_deepspeed passes --model-size to train" in result.stdout
    assert "fix: remove '--model-size' from the job's parameters" in result.stdout


FULL_FINE_TUNING = ("--lora-rank", "0")
# The torch_distributor job in steps of 3 blocks, a checkpoint every 2: its 15 blocks a rank make 5 steps an epoch, so
# all but every fifth checkpoint fall mid-epoch, and a kill after the first lands mid-epoch, mid-run (16 steps left).
MID_EPOCH_CHECKPOINTS = ("--batch-size", "3", "--checkpoint-every-steps", "2")
FINE_TUNING_KILLED_EPOCHS = {"epochs": "4"}
# The fine-tuning project's classic jobs: DeepSpeed's fine-tunes every weight, the others train LoRA adapters.
FINE_TUNING = {"engine": "all", "task": "fine_tune",
               "train_options": {"deepspeed": FULL_FINE_TUNING, "torch_distributor": MID_EPOCH_CHECKPOINTS}}


def assert_fine_tuned(platform: LocalPlatform, engine: str, run) -> dict:
    """The run's metrics, once its held-out loss is below the base model's on the same rows and its MLflow run
    finished."""
    assert_succeeded(run)
    metrics = metrics_of(platform, engine, run)
    assert metrics["held_out_loss"] < metrics["start_held_out_loss"], metrics
    assert metrics["job_run_id"] == str(run.run_id)
    assert mlflow_run(platform, metrics["mlflow_run_id"]).info.status == "FINISHED"
    return metrics


def test_the_fine_tuning_job_trains_its_base_model_in_a_run_of_its_own_and_a_repair_ends_as_an_uninterrupted_run(
        platform_of):
    """torch_distributor with LoRA: a run, then another killed mid-epoch after its first checkpoint in its first attempt
    and in its retry, repaired: it resumes mid-epoch in its own folder, from the base model the bundle variable names,
    and ends with the uninterrupted run's held-out loss and weights."""
    engine = "torch_distributor"
    platform = platform_of(**FINE_TUNING)
    uninterrupted = platform.run_job(f"train_{engine}", FINE_TUNING_KILLED_EPOCHS)
    reference = assert_fine_tuned(platform, engine, uninterrupted)
    assert reference["resumed_from_step"] is None and reference["updates_per_epoch"] == 5

    killed = Interrupt("train", first_checkpoint_done(platform, engine), attempts=(0, 1))
    repaired = platform.run_job(f"train_{engine}", FINE_TUNING_KILLED_EPOCHS, interrupt=killed)
    assert [attempt.state for attempt in repaired.attempts] == ["FAILED", "FAILED"], repaired.report()
    platform.repair(repaired)
    metrics = assert_fine_tuned(platform, engine, repaired)
    assert repaired.run_id != uninterrupted.run_id and metrics["mlflow_run_id"] != reference["mlflow_run_id"]
    assert resumed_mid_run(metrics) and "using the data staged at" in repaired.latest("train").output
    assert metrics["resumed_from_step"] % metrics["updates_per_epoch"] != 0, "the resume should start mid-epoch"
    assert metrics["start_held_out_loss"] == reference["start_held_out_loss"]  # the base model's, kept by the resume
    assert metrics["held_out_loss"] == pytest.approx(reference["held_out_loss"], rel=1e-5)
    ours, theirs = (torch.load(run_folder(platform, engine, run) / "model.pt", weights_only=True)
                    for run in (repaired, uninterrupted))
    assert ours.keys() == theirs.keys() and any("lora_" in name for name in ours)
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in theirs) < 1e-6
    client = platform.mlflow()
    experiment = client.get_run(metrics["mlflow_run_id"]).info.experiment_id
    (logged,) = (model for model in client.search_logged_models([experiment])
                 if model.source_run_id == metrics["mlflow_run_id"])
    served = run_folder(platform, engine, repaired) / "served.pt"  # the logits-only module's model, loaded where the
    load = ("import sys, mlflow.pytorch, torch; "  # project's package is importable, as its jobs have it
            "torch.save(mlflow.pytorch.load_model(sys.argv[1]).model.state_dict(), sys.argv[2])")
    subprocess.run([sys.executable, "-c", load, logged.artifact_location, str(served)], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(platform.project / "src")})
    served = torch.load(served, weights_only=True)
    assert served.keys() == ours.keys() and all(torch.equal(value, ours[name]) for name, value in served.items())


@pytest.mark.parametrize("engine", ["deepspeed", "ray"])
def test_every_engine_s_fine_tuning_job_lowers_the_base_model_s_held_out_loss(platform_of, engine, pretrained,
                                                                              request):
    """DeepSpeed in full (--lora-rank 0 added to its job: every weight trained), Ray with LoRA (the base weights as they
    were, beside the adapters)."""
    if engine == "deepspeed":
        request.getfixturevalue("deepspeed_op_built")
    platform = platform_of(**FINE_TUNING)
    run = platform.run_job(f"train_{engine}", EPOCHS)
    metrics = assert_fine_tuned(platform, engine, run)
    assert [epoch["epoch"] for epoch in metrics["epochs"]] == [1, 2] and metrics["resumed_from_step"] is None
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(pretrained("llama")).state_dict()
    trained = torch.load(run_folder(platform, engine, run) / "model.pt", weights_only=True)
    adapters = [name for name in trained if "lora_" in name]
    as_base = {name.replace("base_model.model.", "").replace(".base_layer", ""): value
               for name, value in trained.items() if "lora_" not in name}
    assert as_base.keys() == base.keys()
    changed = [name for name in base if not torch.equal(as_base[name], base[name])]
    if FINE_TUNING["train_options"].get(engine) == FULL_FINE_TUNING:
        assert not adapters and changed == list(base)
    else:
        assert adapters and not changed


def test_the_serverless_fine_tuning_job_stages_with_the_base_model_and_its_gpu_task_fine_tunes_it(platform_of,
                                                                                                  pretrained):
    """The stage task tokenizes with the tokenizer of the base model the bundle variable names and hands the run's
    config, that model in it, to the GPU task, which fine-tunes it with LoRA under torchrun."""
    engine = "torch_distributor"
    platform = platform_of(compute="serverless_gpu", engine=engine, task="fine_tune")
    run = platform.run_job(f"train_{engine}", EPOCHS)
    assert [(attempt.task_key, attempt.state) for attempt in run.attempts] == [
        ("stage", SUCCESS), ("train", SUCCESS)], run.report()
    assert_fine_tuned(platform, engine, run)
    config = json.loads((run_folder(platform, engine, run) / "torchrun" / "config.json").read_text())
    assert config["task_options"]["base_model"] == pretrained("llama") and config["task_options"]["lora_rank"] == 16
