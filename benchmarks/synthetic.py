"""Staged data written straight with pyarrow, without Spark: for machines that have no pyspark (the GPU check) and
for loader benchmarks that need more rows than a quick Spark staging gives.

The folder has the shape `training.staging` writes (train/ and test/ with one parquet file per process, and a
manifest), so the training loop cannot tell the difference. The label depends on the features, so loss falls.
"""

from __future__ import annotations

import os


def write_staged(directory: str, train_rows: int, test_rows: int, files: int, seed: int = 0):
    """Write a staged folder of random features and a learnable label; returns its StagedData."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distributed_training.training.staged import ColumnStats, StagedData
    from distributed_training.training.trips import FEATURE_COLUMNS, LABEL_COLUMN

    rng = np.random.default_rng(seed)
    weights = rng.normal(size=len(FEATURE_COLUMNS)).astype(np.float32)

    def split(rows: int):
        features = rng.normal(size=(rows, len(FEATURE_COLUMNS))).astype(np.float32)
        label = 15.0 + 4.0 * features @ weights + np.sin(features[:, 0]) + rng.normal(0, 0.5, rows).astype(np.float32)
        return features, label.astype(np.float32)

    staged = None
    for name, rows in (("train", train_rows), ("test", test_rows)):
        features, label = split(rows)
        if name == "train":
            staged = StagedData(
                directory=directory, feature_columns=FEATURE_COLUMNS, label_column=LABEL_COLUMN,
                feature_stats=tuple(ColumnStats(float(column.mean()), float(column.std()) or 1.0) for column in features.T),
                label_stats=ColumnStats(float(label.mean()), float(label.std()) or 1.0),
                train_rows=train_rows, test_rows=test_rows, source="synthetic",
            )
        folder = os.path.join(directory, name)
        os.makedirs(folder, exist_ok=True)
        for part, rows_of_part in enumerate(np.array_split(np.arange(rows), files)):
            columns = {column: features[rows_of_part, index] for index, column in enumerate(FEATURE_COLUMNS)}
            columns[LABEL_COLUMN] = label[rows_of_part]
            pq.write_table(pa.table(columns), os.path.join(folder, f"part-{part:05d}.parquet"))
    staged.save()
    return staged
