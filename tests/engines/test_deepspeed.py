"""DeepSpeed for real: DeepspeedTorchDistributor, two CPU processes (DeepSpeed's CPU accelerator, gloo), ZeRO 2, both
tasks; its config from the run's options over a config to start from, checked by DeepSpeed before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distributed_training import config as configuration
from distributed_training.engines import LaunchError
from distributed_training.engines.deepspeed import ENGINE, check_with_deepspeed
from distributed_training.task_interface import load_task
from distributed_training.training.checkpoints import tag_of
from distributed_training.training.data import StagedData
from distributed_training.training.deepspeed_config import deepspeed_config
from distributed_training.training.loop import load_weights
from distributed_training.training.strategy import checkpoint_weights

from conftest import FARE, LANGUAGE, assert_it_learned

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("task, accumulation", [(FARE, 2), (LANGUAGE, 1)])
def test_two_processes_learn_under_zero_2_and_record_the_run(spark, staged_run, task, accumulation, monkeypatch,
                                                            deepspeed_op_built):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = staged_run(task, engine="deepspeed", epochs=3, grad_accumulation=accumulation, tracking=True,
                        zero_stage=2)
    run = ENGINE.train(spark, config, {})
    metrics = run.metrics
    assert "DeepspeedTorchDistributor, 2 CPU process(es)" in run.description and metrics["world_size"] == 2
    assert_it_learned(metrics, task)
    written = json.loads(Path(config.output_dir, "deepspeed_config.json").read_text())
    assert written["zero_optimization"] == {"stage": 2} and "optimizer" not in written and "scheduler" not in written
    assert written["train_batch_size"] == 32 * 2 * accumulation and written["gradient_clipping"] == config.grad_clip
    per_epoch = metrics["updates_per_epoch"]
    assert sorted(path.name for path in Path(config.output_dir, "checkpoints").glob("step-*")) == \
        [tag_of(2 * per_epoch), tag_of(3 * per_epoch)]
    params = Path(config.output_dir, "mlruns").glob(f"*/{metrics['mlflow_run_id']}/params/zero_stage")
    assert [path.read_text() for path in params] == ["2"]
    # --init-from reads a DeepSpeed checkpoint's weights as a plain model's, whole and in fp32
    weights = checkpoint_weights(str(Path(config.output_dir, "checkpoints")), tag_of(3 * per_epoch))
    model = load_task(task).build_model(StagedData.load(config.staging_dir).stats, config.task_options)
    load_weights(model, weights, "the DeepSpeed run")
    assert all(value.dtype == torch.float32 for value in weights.values() if value.is_floating_point())


def options(*argv: str):
    return configuration.from_args(["--engine", "deepspeed", "--task", FARE, "--local", *argv])


def test_a_config_deepspeed_refuses_is_refused_before_training(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 3, "bogus": 1}}))
    with pytest.raises(LaunchError, match="DeepSpeed config is not valid: .*bogus"):
        check_with_deepspeed(deepspeed_config(options("--deepspeed-config", str(bad)), 2, "fp32"))


def test_the_advice_of_advise_is_the_starting_point_and_options_override_it(tmp_path):
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"deepspeed_config": {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True},
        "optimizer": {"type": "Adam", "params": {"lr": 1}}}}))
    config = deepspeed_config(options("--deepspeed-config", str(advice)), 8, "bf16")
    check_with_deepspeed(config)
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert config["bf16"] == {"enabled": True} and config["train_batch_size"] == 64 * 8
    assert "optimizer" not in config  # the loop's AdamW and schedule, never a second definition
    overridden = deepspeed_config(options("--deepspeed-config", str(advice), "--zero-stage", "1", "--offload", "none"),
                                  8, "fp32")
    assert overridden["zero_optimization"] == {"stage": 1} and "bf16" not in overridden


def test_an_advice_without_deepspeed_is_a_usage_error(tmp_path, capsys):
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"fits": True, "deepspeed_config": None}))
    with pytest.raises(SystemExit):
        options("--deepspeed-config", str(advice))
    assert "recommends no DeepSpeed" in capsys.readouterr().err
