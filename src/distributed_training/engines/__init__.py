"""The engines, each training on a Spark cluster its own way behind one interface (`Engine`): one module per engine,
named after it, holding `ENGINE`; a project carries (and `train --engine` offers) the engines it chose."""

import importlib.util
import os
from dataclasses import dataclass
from typing import ClassVar

from ..compute.requirements import ENGINES
from ..config import Config
from ..task_interface import load_task

WAREHOUSE_DIR = "spark-warehouse"


class LaunchError(Exception):
    """The run cannot start (or did not finish) as asked; the message says why and what to do."""


@dataclass(frozen=True)
class TrainingRun:
    description: str
    metrics: dict


class Engine:
    """How one engine trains. The launcher calls `local_session` (with --local), then `train`."""

    name: ClassVar[str]

    def default_table(self, config: Config) -> str:
        return load_task(config.task).DEFAULT_TABLE

    def sample_table(self, spark, config: Config):
        return load_task(config.task).sample_table(spark, config.seed)

    def local_session(self, config: Config):
        from .local_spark import local_spark_session

        return local_spark_session(cores=max(config.placement.world_size, 2),
                                   warehouse_dir=os.path.join(config.output_dir, WAREHOUSE_DIR))

    def train(self, spark, config: Config, environment: dict[str, str]) -> TrainingRun:
        """Train as the resolved `config` says; `environment`: what the process logging to MLflow needs to reach it."""
        raise NotImplementedError


def available() -> tuple[str, ...]:
    return tuple(name for name in ENGINES if importlib.util.find_spec(f"{__package__}.{name}") is not None)


def engine(name: str) -> Engine:
    return importlib.import_module(f".{name}", __package__).ENGINE
