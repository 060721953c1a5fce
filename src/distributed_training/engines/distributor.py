"""The shared loop under DDP on each process TorchDistributor starts (a GPU's); deepspeed.py specialises it."""
# One process per driver GPU on a single-node cluster (`local_mode=True`), else one per executor GPU, of one worker or
# more (`local_mode=False`, `spark.task.resource.gpu.amount` 1; preflight). It pickles what it runs to the workers:
# the module-level `training.loop.train` and the run's `Config`.

import os

from ..config import Config, Placement
from ..data.staging import stage
from ..task_interface import load_task
from . import Engine, TrainingRun, failures


class TorchDistributorEngine(Engine):
    name = "torch_distributor"

    def train(self, spark, config: Config, environment: dict[str, str]) -> TrainingRun:
        from ..training.loop import train as train_on_every_rank

        where = config.placement
        self.prepare(config, where)
        stage(spark, load_task(config.task), config, where.world_size)
        distributor, description = self.distributor(config, where), self.describe(where)
        failures_dir = failures.folder(config.output_dir)
        metrics = failures.reported(lambda: distributor.run(run_on_a_rank, train_on_every_rank, failures_dir, config,
                                                            environment), config.output_dir, description)
        return TrainingRun(description, metrics)

    def prepare(self, config: Config, where: Placement) -> None:
        """What the engine checks or writes before the data is staged (nothing, for plain DDP)."""

    def distributor(self, config: Config, where: Placement):
        from pyspark.ml.torch.distributor import TorchDistributor

        return TorchDistributor(num_processes=where.world_size, local_mode=not where.on_workers, use_gpu=where.use_gpu)

    def describe(self, where: Placement) -> str:
        mode = "on the executors (local_mode=False)" if where.on_workers else "on the driver (local_mode=True)"
        return f"TorchDistributor, {where.describe()} {mode}, {'NCCL' if where.use_gpu else 'gloo'}"


# TorchDistributor pickles what it runs to the workers: the module-level `training.loop.train` and the run's `Config`.
def run_on_a_rank(train_function, failures_dir: str, *args):
    """The loop, its failure recorded; a rank other than a node's first (whose result is read) leaves at once."""
    from ..training import ranks

    result = failures.run_recording_failure(train_function, failures_dir, *args, exit_quietly=True)
    if os.environ.get("LOCAL_RANK", "0") != "0":
        ranks.leave_now()
    return result
