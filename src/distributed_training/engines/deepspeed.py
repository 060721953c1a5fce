"""Train with DeepspeedTorchDistributor: the same loop, DeepSpeed's engine (ZeRO) making the updates.

The DeepSpeed distributor is TorchDistributor with a DeepSpeed config, for models that need more compute but are
limited by memory; this engine specialises the TorchDistributor one the same way. Placement is the same: one node
(`localMode=True`, a process per GPU of the driver) unless more are asked for (`localMode=False`, `numGpus` per node
x `nnodes`). Without GPUs the processes run on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) over gloo.

The config comes from the run's options (ZeRO stage, offload, precision, batch sizes, clipping; the optimizer and
learning-rate schedule are the loop's), optionally on top of one `advise` printed (--deepspeed-config). It is checked
with DeepSpeed's own config classes before anything starts and written to OUTPUT_DIR/deepspeed_config.json.
"""

from __future__ import annotations

import os

from ..config import Config, Placement
from ..files import write_json
from ..training.deepspeed_config import deepspeed_config, offload_of, overridden
from . import LaunchError
from .torch_distributor import TorchDistributorEngine

CONFIG_FILE = "deepspeed_config.json"


class DeepSpeedEngine(TorchDistributorEngine):
    name = "deepspeed"

    def prepare(self, config: Config, where: Placement) -> None:
        if not where.use_gpu:
            os.environ["DS_ACCELERATOR"] = "cpu"  # the processes inherit it; without it DeepSpeed looks for CUDA
        generated = deepspeed_config(config, where.world_size, config.precision)
        check_with_deepspeed(generated)
        write_json(os.path.join(config.output_dir, CONFIG_FILE), generated)
        zero = generated["zero_optimization"]
        decided = overridden(config)
        print(f"DeepSpeed: ZeRO stage {zero['stage']}, offload {offload_of(zero)}, {config.precision}, "
              f"{generated['train_batch_size']} examples per optimizer step"
              + (f" ({', '.join(decided)} of --deepspeed-config replaced by the loop's options)" if decided else ""),
              flush=True)

    def distributor(self, config: Config, where: Placement):
        from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

        return DeepspeedTorchDistributor(numGpus=where.processes_per_node, nnodes=where.nodes,
                                         localMode=where.nodes == 1, useGpu=where.use_gpu,
                                         deepspeedConfig=os.path.join(config.output_dir, CONFIG_FILE))

    def describe(self, where: Placement) -> str:
        mode = "on the driver (localMode=True)" if where.nodes == 1 else "on the executors (localMode=False)"
        return (f"DeepspeedTorchDistributor, {where.describe()} {mode}, "
                f"{'NCCL' if where.use_gpu else 'gloo, DeepSpeed CPU accelerator'}")


def check_with_deepspeed(config: dict) -> None:
    """DeepSpeed's own config classes on the generated config (unknown keys, bad stages, conflicting precisions)."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as error:
        raise LaunchError(f"the deepspeed engine needs DeepSpeed, which does not import here ({error}): use a "
                          "Databricks Runtime ML, or `pip install --no-build-isolation deepspeed` after torch") from None
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    try:
        DeepSpeedConfig({**config, "train_batch_size": micro * steps})  # outside a process group: a world of one
    except Exception as error:  # pydantic's ValidationError, or an AssertionError on a contradiction
        raise LaunchError(f"the DeepSpeed config is not valid: {' '.join(str(error).split())}. Fix --deepspeed-config "
                          "or the --zero-stage / --offload / --precision options") from None


ENGINE = DeepSpeedEngine()
