"""Stage the training data with Spark: features, a seeded train/held-out split, statistics, parquet for the ranks.

The staging folder must be visible to every rank: a local folder on one machine, a Unity Catalog volume
(/Volumes/catalog/schema/volume/...) on a cluster. Each split is written as one parquet file per process, of about
the same size, so every rank reads its own file and nothing is collected onto the driver.
"""

from __future__ import annotations

from .staged import ColumnStats, StagedData
from .trips import FEATURE_COLUMNS, LABEL_COLUMN, prepare_features, read_trips

TEST_FRACTION = 0.2


def stage_training_data(spark, source: str, directory: str, world_size: int, seed: int = 42,
                        test_fraction: float = TEST_FRACTION) -> StagedData:
    """Read `source` (table name or parquet path), prepare and split it, write it under `directory`."""
    prepared = prepare_features(read_trips(spark, source)).cache()
    try:
        train, test = split(prepared, seed, test_fraction)
        train_rows, test_rows = train.count(), test.count()
        if train_rows < world_size:
            raise ValueError(
                f"{source!r} leaves {train_rows} training row(s) after dropping nonsense rows, fewer than the "
                f"{world_size} processes: train on a larger table"
            )
        feature_stats, label_stats = _column_stats(train)
        staged = StagedData(
            directory=directory, feature_columns=FEATURE_COLUMNS, label_column=LABEL_COLUMN,
            feature_stats=feature_stats, label_stats=label_stats,
            train_rows=train_rows, test_rows=test_rows, source=source,
        )
        train.repartition(world_size).write.mode("overwrite").parquet(staged.train_dir)
        test.repartition(world_size).write.mode("overwrite").parquet(staged.test_dir)
    finally:
        prepared.unpersist()
    staged.save()
    return staged


def split(prepared, seed: int, test_fraction: float = TEST_FRACTION):
    """The seeded train/held-out split of the prepared trips; every engine splits with it, so all are scored on the
    same held-out rows of a table."""
    return prepared.randomSplit([1 - test_fraction, test_fraction], seed=seed)


def _column_stats(train) -> tuple[tuple[ColumnStats, ...], ColumnStats]:
    from pyspark.sql import functions as F

    columns = (*FEATURE_COLUMNS, LABEL_COLUMN)
    row = train.agg(
        *[F.mean(name).alias(f"{name}_mean") for name in columns],
        *[F.stddev_pop(name).alias(f"{name}_std") for name in columns],
    ).first()
    stats = [ColumnStats(mean=float(row[f"{name}_mean"]), std=float(row[f"{name}_std"]) or 1.0) for name in columns]
    return tuple(stats[:-1]), stats[-1]
