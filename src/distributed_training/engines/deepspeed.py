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
import subprocess
import sys
import time

from ..config import Config, Placement
from ..files import write_json
from ..training.deepspeed_config import deepspeed_config, offload_of, overridden
from . import LaunchError
from .distributor import TorchDistributorEngine

CONFIG_FILE = "deepspeed_config.json"
CPU_COMMUNICATION_OP = "deepspeed_shm_comm"
OP_BUILD_SECONDS = 1800  # the build: under a minute on 2 quiet cores, about 8 on 2 busy ones (load 13)
STALE_LOCK_SECONDS = 900  # older than any build: what a killed build left behind
BUILD_OP = ("from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")


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

        if not where.use_gpu:  # after staging: a table that cannot be read fails before this build
            build_cpu_communication_op()

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


def build_cpu_communication_op(timeout: float = OP_BUILD_SECONDS) -> None:
    """Build DeepSpeed's CPU shared-memory communication op before the training processes need it, with a bound.

    DeepSpeed builds it on first use with torch's extension builder, under a lock file in torch's extension folder;
    a build killed midway leaves the lock, and every later build waits on it forever, silently. Here a lock older
    than any build is removed, and a build that does not end in time is an error naming the lock.
    """
    lock = os.path.join(_extension_folder(), "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > STALE_LOCK_SECONDS:
        os.remove(lock)
        print(f"removed {lock}, left by a DeepSpeed op build that was killed", flush=True)
    try:
        subprocess.run([sys.executable, "-c", BUILD_OP], env={**os.environ, "DS_ACCELERATOR": "cpu"},
                       capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"DeepSpeed's CPU communication op did not build within {timeout:g} s: the build waits on "
                          f"the lock {lock}, which a killed build leaves behind. If no other DeepSpeed run is "
                          "building it now, delete that file and run again") from None
    except subprocess.CalledProcessError as error:
        last = (error.stderr.strip().splitlines() or ["no output"])[-1]
        raise LaunchError(f"DeepSpeed's CPU communication op does not build ({last}): it needs a C++ compiler and "
                          "the Python headers") from None


def _extension_folder() -> str:
    """Where torch's extension builder keeps the op's build (and its lock): TORCH_EXTENSIONS_DIR or its default."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(CPU_COMMUNICATION_OP, verbose=False)


ENGINE = DeepSpeedEngine()
