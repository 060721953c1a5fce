"""Train with DeepspeedTorchDistributor: the same loop, DeepSpeed's engine (ZeRO) making the updates.

The DeepSpeed distributor is TorchDistributor with a DeepSpeed config, for models limited by memory; placement is the
same: on a single-node cluster a process per GPU of the driver (`localMode=True`), else `numGpus` per node x `nnodes`
on the workers (`localMode=False`). Without GPUs the processes run on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu).
The config comes from the run's options (ZeRO stage, offload, precision, batch sizes, clipping; the optimizer and
schedule are the loop's), optionally over one `advise` printed (--deepspeed-config), checked with DeepSpeed's own
classes before anything starts and written to OUTPUT_DIR/deepspeed_config.json.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ..config import Config, Placement
from ..files import write_json
from ..training.deepspeed_config import deepspeed_config, offload_of, overridden
from . import LaunchError
from .distributor import TorchDistributorEngine

CONFIG_FILE = "deepspeed_config.json"
CPU_COMMUNICATION_OP = "deepspeed_shm_comm"
OP_BUILD_SECONDS = 1800  # the build: under a minute on 2 quiet cores, about 8 on 2 busy ones (load 13)
BUILD_OP = ("from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
HOLDER_FILE, TAKEN_OVER = "build.holder", "lock taken over"
# Torch's lock (utils/file_baton.py) is a file a killed build leaves behind. Each build here first holds an flock,
# which the kernel releases however its holder ends: a lock found while holding it is a dead build's, taken over.
HOLD_AND_BUILD = f"""import fcntl, os, sys
with open(os.path.join(sys.argv[1], "{HOLDER_FILE}"), "a") as holder:
    fcntl.flock(holder, fcntl.LOCK_EX)
    if os.path.exists(os.path.join(sys.argv[1], "lock")):
        os.remove(os.path.join(sys.argv[1], "lock"))
        print("{TAKEN_OVER}", flush=True)
    exec(sys.argv[2])"""


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
                                         localMode=not where.on_workers, useGpu=where.use_gpu,
                                         deepspeedConfig=os.path.join(config.output_dir, CONFIG_FILE))

    def describe(self, where: Placement) -> str:
        mode = "on the executors (localMode=False)" if where.on_workers else "on the driver (localMode=True)"
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
    """Build DeepSpeed's CPU shared-memory communication op, which DeepSpeed builds on first use with torch's
    extension builder, before the training processes need it: after a build killed midway, at once; past a live
    build of another run, within a bound."""
    folder = _extension_folder()
    try:
        built = subprocess.run([sys.executable, "-c", HOLD_AND_BUILD, folder, BUILD_OP], capture_output=True,
                               env={**os.environ, "DS_ACCELERATOR": "cpu"}, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"DeepSpeed's CPU communication op did not build within {timeout:g} s: another run's build "
                          f"holds {os.path.join(folder, HOLDER_FILE)}; let it end, or stop it") from None
    except subprocess.CalledProcessError as error:
        last = (error.stderr.strip().splitlines() or ["no output"])[-1]
        missing = last.split("'")[1] if last.startswith("ModuleNotFoundError") and "'" in last else None
        raise LaunchError(f"DeepSpeed's CPU communication op does not build ({last}): " + (
            f"install {missing} where the run starts" if missing else
            "it needs a C++ compiler and the Python headers")) from None
    if built.stdout.startswith(TAKEN_OVER):
        print(f"removed {os.path.join(folder, 'lock')}, left by a DeepSpeed op build that was killed", flush=True)


def _extension_folder() -> str:
    """Where torch's extension builder keeps the op's build (and its lock): TORCH_EXTENSIONS_DIR or its default."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(CPU_COMMUNICATION_OP, verbose=False)


ENGINE = DeepSpeedEngine()
