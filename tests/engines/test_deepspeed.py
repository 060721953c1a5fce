"""DeepSpeed for real: DeepspeedTorchDistributor, two CPU processes (DeepSpeed's CPU accelerator, gloo), ZeRO 2.

Quality, as for TorchDistributor: the held-out RMSE must be at least 3 times smaller than predicting the mean.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distributed_training.engines import deepspeed
from distributed_training.engines.settings import LaunchError, RunSettings
from distributed_training.training.sample_data import write_sample_trips

pytestmark = pytest.mark.engine

BETTER_THAN_THE_MEAN = 3.0


def settings(output_dir, table, **options):
    return RunSettings(engine="deepspeed", local=True, table=table, output_dir=str(output_dir), num_nodes=1,
                       gpus_per_node=0, processes=2, epochs=4, batch_size=32, learning_rate=3e-3, seed=11,
                       **options)


def test_two_processes_learn_the_fare_under_zero_2_and_record_the_run(spark, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    table = write_sample_trips(spark, str(tmp_path / "sample_trips"), rows=2000, seed=11)
    run = deepspeed.train(spark, settings(tmp_path / "run", table, zero_stage=2, grad_accumulation=2))

    metrics, final = run.metrics, run.metrics["final"]
    assert "DeepspeedTorchDistributor, 2 CPU process(es)" in run.description
    assert metrics["world_size"] == 2 and metrics["strategy"] == "deepspeed" and len(metrics["epochs"]) == 4
    assert final["test_rmse"] * BETTER_THAN_THE_MEAN < final["baseline_rmse"], final
    written = json.loads((tmp_path / "run" / "deepspeed_config.json").read_text())
    assert written["zero_optimization"] == {"stage": 2}
    assert written["train_batch_size"] == 32 * 2 * 2 and written["gradient_accumulation_steps"] == 2
    assert sorted(path.name for path in (tmp_path / "run" / "checkpoints").glob("epoch-*")) == \
        ["epoch-00003", "epoch-00004"]
    params = Path(tmp_path, "run", "mlruns").glob(f"*/{metrics['mlflow_run_id']}/params/zero_stage")
    assert [path.read_text() for path in params] == ["2"]


def test_an_advice_without_deepspeed_and_a_bad_config_are_refused_before_training(tmp_path):
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"fits": True, "deepspeed_config": None}))
    with pytest.raises(LaunchError, match="does not recommend DeepSpeed"):
        deepspeed.load_base_config(str(advice))
    config = deepspeed.generate_config(settings(tmp_path, "t"), "fp32", world_size=2,
                                       base={"zero_optimization": {"stage": 3, "bogus": 1}})
    with pytest.raises(LaunchError, match="DeepSpeed config is not valid: .*bogus"):
        deepspeed.validate_config(config)
    with pytest.raises(LaunchError, match="offloading the weights needs ZeRO stage 3"):
        deepspeed.generate_config(settings(tmp_path, "t", zero_stage=2, offload="optimizer+weights"), "fp32", 2)


def test_the_advice_of_advise_is_the_starting_point_and_options_override_it(tmp_path):
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"deepspeed_config": {"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True}}}))
    base = deepspeed.load_base_config(str(advice))
    config = deepspeed.generate_config(settings(tmp_path, "t"), "bf16", world_size=8, base=base)
    deepspeed.validate_config(config)
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert config["bf16"] == {"enabled": True} and config["train_batch_size"] == 32 * 8
    overridden = deepspeed.generate_config(settings(tmp_path, "t", zero_stage=1, offload="none"), "fp32", 8, base)
    assert overridden["zero_optimization"] == {"stage": 1} and "bf16" not in overridden
