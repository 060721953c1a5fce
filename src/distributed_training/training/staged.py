"""Staged training data as the ranks see it: parquet files on a shared folder, and the manifest that describes them.

Spark writes the prepared features once (see `staging`); every rank then reads only its own share of the files
with pyarrow. Nothing here needs Spark, so the same reader serves TorchDistributor, DeepSpeed, Ray and torchrun.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ColumnStats:
    mean: float
    std: float  # never 0: a constant column gets 1, so normalising leaves it at 0


@dataclass(frozen=True)
class StagedData:
    """Where the prepared splits are, their columns, and the training split's statistics (computed in Spark)."""

    directory: str  # holds train/, test/ and the manifest
    feature_columns: tuple[str, ...]
    label_column: str
    feature_stats: tuple[ColumnStats, ...]  # in the order of feature_columns
    label_stats: ColumnStats
    train_rows: int
    test_rows: int
    source: str  # the table or path the data came from

    @property
    def train_dir(self) -> str:
        return os.path.join(self.directory, "train")

    @property
    def test_dir(self) -> str:
        return os.path.join(self.directory, "test")

    def save(self) -> str:
        path = os.path.join(self.directory, MANIFEST)
        with open(path, "w") as file:
            json.dump(asdict(self), file, indent=2)
        return path

    @classmethod
    def load(cls, directory: str) -> StagedData:
        path = os.path.join(directory, MANIFEST)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"no staged data at {directory}: {MANIFEST} is missing. Stage the data first, e.g. with "
                "`train --local --output-dir DIR` (it stages into DIR/staging)"
            )
        with open(path) as file:
            fields = json.load(file)
        return cls(
            **{**fields, "directory": directory, "feature_columns": tuple(fields["feature_columns"]),
               "feature_stats": tuple(ColumnStats(**stats) for stats in fields["feature_stats"]),
               "label_stats": ColumnStats(**fields["label_stats"])}
        )


def parquet_files(directory: str) -> list[str]:
    """The data files Spark wrote into `directory`, in a stable order (every rank must list the same)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no staged split at {directory}: stage the data again")
    return sorted(
        os.path.join(directory, name) for name in os.listdir(directory)
        if name.endswith(".parquet") and not name.startswith((".", "_"))
    )


def files_for_rank(files: list[str], rank: int, world_size: int) -> list[str]:
    """This rank's share: every world_size-th file, starting at its rank. Shares are disjoint and cover all files."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return files[rank::world_size]


def read_shard(directory: str, columns: list[str], rank: int, world_size: int, require_rows: bool = True):
    """This rank's rows of one split as a float32 numpy array, columns in the order given."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = parquet_files(directory)
    if require_rows and len(files) < world_size:
        raise ValueError(
            f"{directory} holds {len(files)} parquet file(s) for {world_size} processes, so some would get no "
            f"data: stage it again for {world_size} processes (the staging writes one file per process)"
        )
    mine = files_for_rank(files, rank, world_size)
    if not mine:
        return np.zeros((0, len(columns)), dtype=np.float32)
    table = pa.concat_tables(pq.read_table(path, columns=columns) for path in mine)
    rows = np.empty((table.num_rows, len(columns)), dtype=np.float32)
    for index, name in enumerate(columns):  # one copy per column, straight into place (staged columns are float32)
        rows[:, index] = table.column(name).to_numpy()
    return rows
