"""The data path: our staged-parquet reader and batch loader against pyarrow and plain tensor indexing.

1. Reading: `staged.read_shard` (what every rank runs) against pyarrow reading the same files straight into a
   tensor, rows per second.
2. Batching: the loop's `ShuffledBatches` over one epoch against slicing a random permutation by hand, rows per
   second; and, for the record, the per-row `DataLoader(shuffle=True)` the loop used before.
"""

from __future__ import annotations

import os

from .measure import Row, alternate, median, seconds
from .synthetic import write_staged

BATCH_SIZE = 64  # the loop's default: small batches are where a loader's cost per batch shows


def run(work_dir: str, quick: bool) -> list[Row]:
    rows = 40_000 if quick else 1_000_000
    repetitions = 2 if quick else 5
    staged = write_staged(os.path.join(work_dir, "data_path"), train_rows=rows, test_rows=1000, files=4)
    columns = [*staged.feature_columns, staged.label_column]
    return [
        *_reading(staged.train_dir, columns, rows, repetitions),
        *_batching(min(rows, 200_000), len(staged.feature_columns), repetitions),
    ]


def _reading(directory: str, columns: list[str], rows: int, repetitions: int) -> list[Row]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from distributed_training.training.staged import parquet_files, read_shard

    files = parquet_files(directory)

    def ours() -> float:
        elapsed, tensor = seconds(lambda: torch.from_numpy(read_shard(directory, columns, rank=0, world_size=1)))
        assert tensor.shape == (rows, len(columns))
        return rows / elapsed

    def pyarrow_straight() -> float:
        def read():
            table = pq.read_table(files, columns=columns) if len(files) > 1 else pq.read_table(files[0], columns=columns)
            return torch.from_numpy(np.stack([table.column(name).to_numpy() for name in columns], axis=1))

        elapsed, tensor = seconds(read)
        assert tensor.shape == (rows, len(columns))
        return rows / elapsed

    measured = alternate({"ours": ours, "pyarrow": pyarrow_straight}, repetitions)
    return [Row("data path", f"read {rows:,} staged rows into a tensor (read_shard)", median(measured["ours"]),
                median(measured["pyarrow"]), "rows/s", "baseline: pyarrow.read_table + numpy stack, same files")]


def _batching(rows: int, width: int, repetitions: int) -> list[Row]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from distributed_training.training.loop import ShuffledBatches

    features, labels = torch.randn(rows, width), torch.randn(rows)

    def epoch_of(batches) -> float:
        def go():
            count = 0
            for batch_features, batch_labels in batches:
                count += len(batch_labels)
            return count

        elapsed, count = seconds(go)
        assert count == rows
        return rows / elapsed

    def by_hand():
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
        for start in range(0, rows, BATCH_SIZE):
            chosen = order[start:start + BATCH_SIZE]
            yield features[chosen], labels[chosen]

    measured = alternate({
        "ours": lambda: epoch_of(ShuffledBatches(features, labels, BATCH_SIZE, seed=0)),
        "by hand": lambda: epoch_of(by_hand()),
        "per row": lambda: epoch_of(DataLoader(TensorDataset(features, labels), batch_size=BATCH_SIZE, shuffle=True,
                                               generator=torch.Generator().manual_seed(0))),
    }, repetitions)
    baseline = median(measured["by hand"])
    return [
        Row("data path", f"one epoch of shuffled batches of {BATCH_SIZE} (ShuffledBatches)", median(measured["ours"]),
            baseline, "rows/s", "baseline: a random permutation sliced by hand"),
        Row("data path", f"the same with a per-row DataLoader(shuffle=True) (before)", median(measured["per row"]),
            baseline, "rows/s", "what the loop used before; replaced by ShuffledBatches"),
    ]
