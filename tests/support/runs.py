"""Runs of the real pieces, small: a config as `train` resolves it, and data staged by real Spark through a task."""

from __future__ import annotations

import dataclasses

from distributed_training.config import Config
from distributed_training.data.staging import stage
from distributed_training.task_interface import load_task

FARE = "distributed_training.tasks.fare_regression"
LANGUAGE = "distributed_training.tasks.causal_lm"
DROPOUT_FARES = "support.dropout_fares"  # draws random numbers at every training step


def resolved_config(output_dir, task: str = FARE, **overrides) -> Config:
    """A config as `train --local` resolves it (CPU, fp32, no MLflow unless asked), its task's default options."""
    options = overrides.pop("task_options", load_task(task).Options())
    values = {"engine": "torch_distributor", "task": task, "local": True, "output_dir": str(output_dir),
              "gpus_per_node": 0, "processes": 2, "precision": "fp32", "tracking": False, "epochs": 2,
              "batch_size": 32, "task_options": options, **overrides}
    return Config(**values)


def staged(spark, config: Config, world_size: int, rows: int = 2000):
    """The task's sample table, staged for `world_size` processes under config.output_dir."""
    task = load_task(config.task)
    table = f"{config.output_dir}/sample_table"
    task.sample_table(spark, config.seed).limit(rows).coalesce(1).write.mode("overwrite").parquet(table)
    config = dataclasses.replace(config, table=table)
    return config, stage(spark, task, config, world_size)
