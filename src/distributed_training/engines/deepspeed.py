"""Train with DeepspeedTorchDistributor: the same torch loop, with DeepSpeed's engine (ZeRO) making the updates.

The DeepSpeed distributor is TorchDistributor with a DeepSpeed config: for models that need more compute but are
limited by memory. Placement follows the platform's advice as the TorchDistributor launcher does: one node
(`localMode=True`, one process per GPU of the driver) unless more nodes are asked for (`localMode=False`,
`numGpus` per node x `nnodes`). With `--local` (or no GPU) the processes run on CPU: DeepSpeed's CPU accelerator
(DS_ACCELERATOR=cpu) over gloo.

The config is generated from the settings (ZeRO stage, offload, precision, batch sizes, optimizer), optionally on
top of one that `advise` printed (--deepspeed-config), checked with DeepSpeed's own config classes before anything
starts, and written to OUTPUT_DIR/deepspeed_config.json, which the distributor is given and MLflow records.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from ..training.config import TrainingConfig
from ..training.strategy import DEEPSPEED
from . import failures
from .prepare import stage_and_configure
from .settings import DEFAULT_LOCAL_PROCESSES, LaunchError, RunSettings, TrainingRun

CONFIG_FILE = "deepspeed_config.json"
FAILURES_DIR = "failures"
STEPS_PER_PRINT = 10 ** 9  # the loop prints its own progress once an epoch; DeepSpeed's step lines only add noise


@dataclass(frozen=True)
class Placement:
    processes_per_node: int  # numGpus (CPU processes without GPUs)
    nodes: int
    use_gpu: bool

    @property
    def local_mode(self) -> bool:
        return self.nodes == 1

    @property
    def world_size(self) -> int:
        return self.processes_per_node * self.nodes

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        where = "on the driver (localMode=True)" if self.local_mode else \
            f"on {self.nodes} nodes across the executors (localMode=False)"
        return (f"DeepspeedTorchDistributor, {self.world_size} {kind} process(es) {where}, "
                f"{'NCCL' if self.use_gpu else 'gloo, DeepSpeed CPU accelerator'}")


def placement(settings: RunSettings) -> Placement:
    if settings.local:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, nodes=1, use_gpu=False)
    if settings.gpus_per_node == 0:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, nodes=settings.num_nodes, use_gpu=False)
    return Placement(settings.gpus_per_node, nodes=settings.num_nodes, use_gpu=True)


def configure(spark, settings: RunSettings) -> TrainingConfig:
    """Generate and check the DeepSpeed config, stage the data; the config every process gets."""
    where = placement(settings)
    if not where.use_gpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # the worker processes inherit it; without it DeepSpeed looks for CUDA
    base = load_base_config(settings.deepspeed_config_file) if settings.deepspeed_config_file else {}
    config = stage_and_configure(spark, settings, world_size=where.world_size, use_gpu=where.use_gpu)
    deepspeed_config = generate_config(settings, config.precision, where.world_size, base)
    validate_config(deepspeed_config)
    config_path = os.path.join(settings.output_dir, CONFIG_FILE)
    with open(config_path, "w") as file:
        json.dump(deepspeed_config, file, indent=2)
    zero = deepspeed_config["zero_optimization"]
    print(f"DeepSpeed config ({config_path}): ZeRO stage {zero['stage']}, offload {offload_of(zero)}, "
          f"precision {config.precision}, {deepspeed_config['train_batch_size']} rows per optimizer step", flush=True)
    return replace(config, strategy=DEEPSPEED, deepspeed_config=deepspeed_config)


def train(spark, settings: RunSettings) -> TrainingRun:
    """Configure, then run the loop on every planned process under the DeepSpeed distributor."""
    where = placement(settings)
    config = configure(spark, settings)
    return TrainingRun(where.describe(), distribute(config, where, os.path.join(settings.output_dir, CONFIG_FILE)))


def generate_config(settings: RunSettings, precision: str, world_size: int, base: dict | None = None) -> dict:
    """The DeepSpeed config for these settings; `base` (e.g. from advise) is kept where the settings say nothing."""
    base = dict(base or {})
    zero = dict(base.pop("zero_optimization", {}))
    if settings.zero_stage is not None:
        zero["stage"] = settings.zero_stage
    zero.setdefault("stage", 2)
    if settings.offload is not None:
        zero.pop("offload_optimizer", None)
        zero.pop("offload_param", None)
        if settings.offload != "none":
            zero["offload_optimizer"] = {"device": "cpu"}
        if settings.offload == "optimizer+weights":
            zero["offload_param"] = {"device": "cpu"}
    if "offload_param" in zero and zero["stage"] != 3:
        raise LaunchError(f"offloading the weights needs ZeRO stage 3, but the stage is {zero['stage']}: "
                          "use --zero-stage 3, or --offload optimizer")
    for name in ("bf16", "fp16"):
        base.pop(name, None)
    config = {
        **base,
        "train_micro_batch_size_per_gpu": settings.batch_size,
        "gradient_accumulation_steps": settings.grad_accumulation,
        "train_batch_size": settings.batch_size * settings.grad_accumulation * world_size,
        # torch's Adam, not DeepSpeed's fused or CPU Adam: those are compiled on first use, which needs a compiler
        # (and the CUDA toolkit) on the cluster. With offload, DeepSpeed must be told that torch's is acceptable.
        "optimizer": {"type": "Adam", "params": {"lr": settings.learning_rate, "torch_adam": True}},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": STEPS_PER_PRINT,
    }
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def validate_config(config: dict) -> None:
    """Check the config with DeepSpeed's own classes (unknown keys, bad stages, conflicting precisions).

    Where DeepSpeed is not installed (the task that stages for a serverless GPU task), DeepSpeed checks it when the
    training processes start."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        print("DeepSpeed is not installed here: the config is checked when the training processes start")
        return

    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    if config["train_batch_size"] % (micro * steps):
        raise LaunchError(f"train_batch_size {config['train_batch_size']} is not a multiple of the micro-batch "
                          f"{micro} x {steps} accumulation steps: leave it out of --deepspeed-config")
    try:
        # Outside a process group DeepSpeed counts a world of one: check the batch sizes for one process.
        DeepSpeedConfig({**config, "train_batch_size": micro * steps})
    except Exception as error:  # pydantic's ValidationError, or an AssertionError on a contradiction
        summary = " ".join(str(error).split())
        raise LaunchError(f"the DeepSpeed config is not valid: {summary}. Fix --deepspeed-config or the "
                          "--zero-stage / --offload / --precision options") from None


def load_base_config(path: str) -> dict:
    """A DeepSpeed config from a JSON file: a config itself, or the output of `advise --json` (its
    deepspeed_config)."""
    try:
        with open(path) as file:
            content = json.load(file)
    except (OSError, ValueError) as error:
        raise LaunchError(f"cannot read --deepspeed-config {path}: {error}") from None
    if not isinstance(content, dict):
        raise LaunchError(f"--deepspeed-config {path} holds no JSON object: give a DeepSpeed config or the output "
                          "of `advise --json`")
    if "deepspeed_config" in content:
        if content["deepspeed_config"] is None:
            raise LaunchError(f"the advice in {path} does not recommend DeepSpeed (its deepspeed_config is null): "
                              "train with the engine it recommends, or drop --deepspeed-config")
        return content["deepspeed_config"]
    return content


def offload_of(zero: dict) -> str:
    parts = [name for key, name in (("offload_optimizer", "optimizer"), ("offload_param", "weights"))
             if zero.get(key, {}).get("device", "none") != "none"]
    return "+".join(parts) or "none"


def distribute(config, where: Placement, config_path: str) -> dict:
    """Run `training.loop.train(config)` on every process under the DeepSpeed distributor."""
    from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

    from ..training.loop import train as train_on_every_rank

    failures_dir = os.path.join(config.output_dir, FAILURES_DIR)
    failures.clear(failures_dir)
    distributor = DeepspeedTorchDistributor(numGpus=where.processes_per_node, nnodes=where.nodes,
                                            localMode=where.local_mode, useGpu=where.use_gpu,
                                            deepspeedConfig=config_path)
    try:
        return distributor.run(failures.run_recording_failure, train_on_every_rank, failures_dir, config)
    except Exception as error:  # the distributor raises RuntimeError, a barrier stage a Py4J or Spark error
        reason = failures.first_failure(failures_dir) or str(error).strip().splitlines()[0]
        raise LaunchError(
            f"training failed in the worker processes ({where.describe()}): {reason}. Their output is above"
        ) from None
