"""Staged data as the ranks see it: parquet files on a shared folder, and the manifest that describes them.

Spark writes the task's prepared rows once (`staging`), one file per process for each split; every rank then reads
only its own files, with pyarrow. Nothing here needs Spark or torch: the serverless stage task writes the manifest
without torch, and torchrun's processes read the files without Spark.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from ..files import write_json

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class StagedData:
    """Where the prepared splits are, how many rows each has, and the task's statistics of the training split."""

    directory: str  # holds train/, test/ and the manifest
    task: str  # the task module that prepared the rows
    source: str  # the table or path they came from
    train_rows: int
    test_rows: int
    files_per_split: int  # the number of processes it was staged for
    stats: dict

    @property
    def train_dir(self) -> str:
        return os.path.join(self.directory, "train")

    @property
    def test_dir(self) -> str:
        return os.path.join(self.directory, "test")

    def save(self) -> None:
        write_json(os.path.join(self.directory, MANIFEST), {k: v for k, v in asdict(self).items() if k != "directory"})

    @classmethod
    def load(cls, directory: str) -> StagedData:
        path = os.path.join(directory, MANIFEST)
        try:
            with open(path) as file:
                content = json.load(file)
        except FileNotFoundError:
            raise FileNotFoundError(f"no staged data at {directory}: {MANIFEST} is missing. Stage the data first "
                                    "(`train` stages into OUTPUT_DIR/staging)") from None
        except ValueError as error:
            raise ValueError(f"{path} is damaged ({error}): stage the data again") from None
        return cls(directory=directory, **content)


def parquet_files(directory: str) -> list[str]:
    """The data files Spark wrote into `directory`, in a stable order (every rank must list the same)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no staged split at {directory}: stage the data again")
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(".parquet") and not name.startswith((".", "_")))


def files_for_rank(files: list[str], rank: int, world_size: int) -> list[str]:
    """This rank's share: every world_size-th file from its rank on. Shares are disjoint and cover every file."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return files[rank::world_size]


def read_shard(directory: str, rank: int, world_size: int, require_rows: bool = True):
    """This rank's rows of one split, as one pyarrow Table (its files read in parallel)."""
    import pyarrow.parquet as pq

    files = parquet_files(directory)
    if not files:
        raise FileNotFoundError(f"{directory} holds no parquet files: stage the data again")
    if require_rows and len(files) < world_size:
        raise ValueError(f"{directory} holds {len(files)} parquet file(s) for {world_size} processes, so some would "
                         f"get no data: stage it again for {world_size} processes")
    mine = files_for_rank(files, rank, world_size)
    if not mine:
        return pq.read_schema(files[0]).empty_table()
    return pq.read_table(mine, use_threads=True)
