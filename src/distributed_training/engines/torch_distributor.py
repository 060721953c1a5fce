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

import os
from dataclasses import dataclass

from ..training.config import TrainingConfig
from . import failures
from .prepare import stage_and_configure
from .settings import DEFAULT_LOCAL_PROCESSES, LaunchError, RunSettings, TrainingRun

FAILURES_DIR = "failures"  # under the output folder, which every rank reaches


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
    """How many processes, where, and on what, for these settings."""
    if settings.local:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, local_mode=True, use_gpu=False)
    single_node = settings.num_nodes == 1
    if settings.gpus_per_node == 0:
        return Placement(settings.processes or DEFAULT_LOCAL_PROCESSES, local_mode=single_node, use_gpu=False)
    return Placement(settings.gpus_per_node * settings.num_nodes, local_mode=single_node, use_gpu=True)


def configure(spark, settings: RunSettings) -> TrainingConfig:
    """Stage the data for the planned number of processes; the config every process gets."""
    where = placement(settings)
    return stage_and_configure(spark, settings, world_size=where.num_processes, use_gpu=where.use_gpu)


def train(spark, settings: RunSettings) -> TrainingRun:
    """Stage and configure, then run the loop on every planned process."""
    where = placement(settings)
    return TrainingRun(where.describe(), distribute(configure(spark, settings), where))


def distribute(config: TrainingConfig, where: Placement) -> dict:
    """Run `training.loop.train(config)` on every process; the run's metrics come back."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from ..training.loop import train as train_on_every_rank

    failures_dir = os.path.join(config.output_dir, FAILURES_DIR)
    failures.clear(failures_dir)
    distributor = TorchDistributor(num_processes=where.num_processes, local_mode=where.local_mode,
                                   use_gpu=where.use_gpu)
    try:
        metrics = distributor.run(failures.run_recording_failure, train_on_every_rank, failures_dir, config)
    except Exception as error:  # TorchDistributor raises RuntimeError, a barrier stage a Py4J or Spark error
        reason = failures.first_failure(failures_dir) or str(error).strip().splitlines()[0]
        raise LaunchError(
            f"training failed in the worker processes ({where.describe()}): {reason}. Their output is above"
        ) from None
    return metrics
