"""Train with TorchDistributor (pyspark.ml.torch): the torch loop under DDP, started from the Spark driver.

Placement, following the platform's advice (single node first):
- one node (`--num-nodes 1`): `local_mode=True`, the processes run on the driver, one per GPU it has;
- several nodes: `local_mode=False`, one process per GPU across the executors (gpus per node x nodes), which needs
  `spark.task.resource.gpu.amount` 1 on the cluster (the preflight checks it);
- `--local` (or a node without GPUs): `use_gpu=False`, N CPU processes talking over gloo.

TorchDistributor pickles the function it runs and its arguments to the worker processes, so it runs the
module-level `training.loop.train` with a plain `TrainingConfig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..training.config import TrainingConfig
from .prepare import stage_and_configure
from .settings import DEFAULT_LOCAL_PROCESSES, LaunchError, RunSettings, TrainingRun


@dataclass(frozen=True)
class Placement:
    num_processes: int
    local_mode: bool  # True: every process on the driver node
    use_gpu: bool

    def describe(self) -> str:
        processes = f"{self.num_processes} {'GPU' if self.use_gpu else 'CPU'} process(es)"
        where = "on the driver (local_mode=True)" if self.local_mode else "across the executors (local_mode=False)"
        return f"TorchDistributor, {processes} {where}, {'NCCL' if self.use_gpu else 'gloo'}"


def placement(settings: RunSettings) -> Placement:
    """How many processes, where, and on what, for these settings (a LaunchError when that cannot work)."""
    if settings.local:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, local_mode=True, use_gpu=False)
    gpus_per_node = settings.gpus_per_node if settings.gpus_per_node is not None else _driver_gpus()
    single_node = settings.num_nodes == 1
    if gpus_per_node == 0:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, local_mode=single_node, use_gpu=False)
    return Placement(gpus_per_node * settings.num_nodes, local_mode=single_node, use_gpu=True)


def check(settings: RunSettings) -> None:
    """Fail before Spark starts when the settings cannot be placed."""
    placement(settings)


def train(spark, settings: RunSettings) -> TrainingRun:
    """Stage the data for the planned number of processes, then run the loop on all of them."""
    where = placement(settings)
    config = stage_and_configure(spark, settings, world_size=where.num_processes, use_gpu=where.use_gpu)
    return TrainingRun(where.describe(), distribute(config, where))


def distribute(config: TrainingConfig, where: Placement) -> dict:
    """Run `training.loop.train(config)` on every process; rank 0's metrics come back."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from ..training.loop import train as train_on_every_rank

    distributor = TorchDistributor(num_processes=where.num_processes, local_mode=where.local_mode,
                                   use_gpu=where.use_gpu)
    try:
        metrics = distributor.run(train_on_every_rank, config)
    except RuntimeError as error:
        raise LaunchError(
            f"training failed in the worker processes ({where.describe()}): {_last_error_line(str(error))}. "
            "Their output is above; fix the cause and run again"
        ) from None
    if metrics is None:
        raise LaunchError("training finished but rank 0 returned no metrics: its output is above")
    return metrics


def _last_error_line(message: str) -> str:
    """The exception line of a worker's traceback (e.g. 'ValueError: ...'), else TorchDistributor's first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", line)]
    return raised[-1] if raised else lines[0] if lines else "no output"


def _driver_gpus() -> int:
    import torch

    return torch.cuda.device_count()
