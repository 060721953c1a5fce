"""Stage the training data with Spark: the task's rows, a seeded train/held-out split, the task's statistics, and
parquet files for the ranks.

The staging folder must be visible to every rank: a local folder on one machine, a Unity Catalog volume
(/Volumes/catalog/schema/volume/...) on a cluster. Each split is written as one parquet file per process, of about the
same size, so every rank reads its own file and nothing is collected onto the driver. No torch is needed here.
"""

from __future__ import annotations

from .config import Config
from .training.data import StagedData

TEST_FRACTION = 0.2


class TableError(ValueError):
    """The training table cannot be read, or the task cannot use it: the message says which and what to do."""


def looks_like_path(source: str) -> bool:
    """A table name is `catalog.schema.table` (or shorter); anything with a slash or a scheme is a path."""
    return "/" in source or ":" in source or source.endswith(".parquet")


def read_table(spark, source: str, default_table: str):
    """The table as a DataFrame, from a table name (spark.table) or a parquet path (spark.read)."""
    from pyspark.errors import AnalysisException

    try:
        table = spark.read.parquet(source) if looks_like_path(source) else spark.table(source)
        table.columns  # noqa: B018 (resolves the table, so a missing one fails here)
    except AnalysisException as error:
        kind = "parquet path" if looks_like_path(source) else "table"
        raise TableError(f"cannot read the {kind} {source!r}: {str(error).splitlines()[0]}. Pass --table with an "
                         f"existing table (catalog.schema.table, default {default_table}) or a parquet path") from None
    return table


def split(prepared, seed: int):
    """The seeded train/held-out split; every engine splits with it, so all are scored on the same held-out rows."""
    return prepared.randomSplit([1 - TEST_FRACTION, TEST_FRACTION], seed=seed)


def stage(spark, task, config: Config, world_size: int) -> StagedData:
    """Read config.table, prepare and split it with the task, write one file per process under the staging dir."""
    try:
        prepared = task.prepare(read_table(spark, config.table, task.DEFAULT_TABLE), config.task_options).cache()
    except ValueError as error:  # the task says why the table does not fit it
        raise TableError(f"{config.table!r}: {error}") from None
    try:
        train, test = split(prepared, config.seed)
        train_rows, test_rows = train.count(), test.count()
        if train_rows < world_size:
            raise TableError(f"{config.table!r} leaves {train_rows} training row(s) after preparation, fewer than the "
                             f"{world_size} processes: train on a larger table")
        if test_rows == 0:
            raise TableError(f"{config.table!r} leaves no held-out rows after preparation: train on a larger table")
        staged = StagedData(directory=config.staging_dir, task=config.task, source=config.table,
                            train_rows=train_rows, test_rows=test_rows, files_per_split=world_size,
                            stats=task.statistics(train, config.task_options))
        train.repartition(world_size).write.mode("overwrite").parquet(staged.train_dir)
        test.repartition(world_size).write.mode("overwrite").parquet(staged.test_dir)
    finally:
        prepared.unpersist()
    staged.save()
    return staged
