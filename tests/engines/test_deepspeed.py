"""DeepSpeed for real: DeepspeedTorchDistributor, two CPU processes (DeepSpeed's CPU accelerator, gloo), ZeRO 2, both
tasks; its config from the run's options over a config to start from, checked by DeepSpeed before anything starts;
the build of its CPU communication op after a build was killed, and beside a build in progress."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distributed_training import config as configuration
from distributed_training.data.staged import StagedData
from distributed_training.engines import LaunchError
from distributed_training.engines import deepspeed as deepspeed_engine
from distributed_training.engines.deepspeed import ENGINE, check_with_deepspeed
from distributed_training.task_interface import load_task
from distributed_training.training.checkpoints import tag_of
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


# What torch's extension loader does around a build (utils/cpp_extension.py, _jit_compile): take the lock file
# (utils/file_baton.py) and build, or wait while the file exists. A stand-in for DeepSpeed's build, which takes
# minutes; the lock, the holding and the taking over are the real ones.
LOAD = """from torch.utils.file_baton import FileBaton
baton = FileBaton(os.path.join(sys.argv[1], "lock"))
if baton.try_acquire():
    baton.release()
else:
    baton.wait()"""
TAKE_OVER_BOUND_S = 60  # a Python start and torch's import, on 2 busy cores; the wait it replaces was 15 minutes


def building(folder: str, seconds: float) -> subprocess.Popen:
    """A build of another run, as build_cpu_communication_op starts one, holding torch's lock for `seconds`."""
    build = ("import time\nfrom torch.utils.file_baton import FileBaton\n"
             "baton = FileBaton(os.path.join(sys.argv[1], 'lock'))\nassert baton.try_acquire()\n"
             f"print('building', flush=True)\ntime.sleep({seconds})\nbaton.release()")
    process = subprocess.Popen([sys.executable, "-c", deepspeed_engine.HOLD_AND_BUILD, folder, build],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "building"
    return process


@pytest.fixture
def op_folder(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(deepspeed_engine, "BUILD_OP", LOAD)
    return deepspeed_engine._extension_folder()


def test_the_lock_of_a_killed_build_is_taken_over_at_once(op_folder, capsys):
    killed = building(op_folder, 600)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    lock = Path(op_folder) / "lock"
    assert lock.exists()  # what the killed build left behind, minutes younger than the old 15 minutes' staleness
    started = time.monotonic()
    deepspeed_engine.build_cpu_communication_op(timeout=2 * TAKE_OVER_BOUND_S)
    assert time.monotonic() - started < TAKE_OVER_BOUND_S and not lock.exists()
    assert f"removed {lock}, left by a DeepSpeed op build that was killed" in capsys.readouterr().out


def test_a_live_build_is_waited_for_and_its_lock_left_to_it(op_folder, capsys):
    live = building(op_folder, 5)
    started = time.monotonic()
    deepspeed_engine.build_cpu_communication_op(timeout=2 * TAKE_OVER_BOUND_S)
    assert live.wait() == 0  # its own release found its lock: nobody removed it under it
    assert time.monotonic() - started > 3 and "removed" not in capsys.readouterr().out


def test_a_live_build_past_the_bound_is_named(op_folder):
    live = building(op_folder, 600)
    try:
        with pytest.raises(LaunchError, match=f"did not build within 3 s: another run's build holds "
                                              f"{op_folder}/build.holder; let it end, or stop it"):
            deepspeed_engine.build_cpu_communication_op(timeout=3)
        assert (Path(op_folder) / "lock").exists() and live.poll() is None
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("failure, named", [
    ("import a_module_no_node_has", "install a_module_no_node_has where the run starts"),
    ("raise OSError('cc1plus: fatal error: Python.h: No such file or directory')",
     "it needs a C++ compiler and the Python headers")])
def test_a_build_that_fails_names_a_missing_module_as_missing(op_folder, monkeypatch, failure, named):
    monkeypatch.setattr(deepspeed_engine, "BUILD_OP", failure)
    with pytest.raises(LaunchError) as refused:
        deepspeed_engine.build_cpu_communication_op(timeout=TAKE_OVER_BOUND_S)
    assert str(refused.value).endswith(f"): {named}")
    assert ("compiler" in str(refused.value)) == ("Python.h" in failure)
