"""Staged data as the ranks read it, and its manifest: no Spark or torch here (the stage task has no torch)."""
# Parquet files on a shared folder, a file per process and split, which each rank reads with pyarrow (token ids:
# memory-mapped from a copy on its node's local disk); torchrun's processes have no Spark.

import contextlib
import glob
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field

from ..files import write_atomically, write_json

MANIFEST = "manifest.json"
LOCAL_DISK = "/local_disk0/tmp"  # a Databricks node's local SSD; elsewhere, the system's temporary folder
COUNT_BYTES = 8  # a local copy of token ids ends with their count, so that a damaged copy is told from a whole one


@dataclass(frozen=True)
class StagedData:
    directory: str  # holds train/, test/ and the manifest
    task: str  # the task module that prepared the rows
    source: str  # the table or path they came from
    train_rows: int
    test_rows: int
    files_per_split: int  # the number of processes it was staged for
    stats: dict  # the task's statistics of the training split
    recipe: dict = field(default_factory=dict)  # what decides the rows: task, its options, seed, source's fingerprint
    token_dtype: str | None = None  # e.g. "uint16": the splits hold token ids (a task that tokenizes); None: rows
    staging_id: str = ""  # new at every staging: names the ranks' local copies of the tokens

    @property
    def train_dir(self) -> str:
        return os.path.join(self.directory, "train")

    @property
    def test_dir(self) -> str:
        return os.path.join(self.directory, "test")

    def save(self) -> None:
        write_json(os.path.join(self.directory, MANIFEST), {k: v for k, v in asdict(self).items() if k != "directory"})

    @classmethod
    def load(cls, directory: str) -> "StagedData":
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

    def shard(self, split: str, rank: int, world_size: int, require_rows: bool = True):
        """This rank's share of a split for the task's `examples`: a pyarrow Table, or memory-mapped token ids."""
        directory = os.path.join(self.directory, split)
        if self.token_dtype is None:
            return read_shard(directory, rank, world_size, require_rows)
        name = f"{self.staging_id}-{split}-rank{rank}-of-{world_size}.{self.token_dtype}"
        return mapped_tokens(directory, rank, world_size, self.token_dtype, require_rows,
                             os.path.join(local_cache(self.directory), name))


def parquet_files(directory: str) -> list[str]:
    """The data files Spark wrote into `directory`, in a stable order (every rank must list the same)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no staged split at {directory}: stage the data again")
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(".parquet") and not name.startswith((".", "_")))


def files_for_rank(files: list[str], rank: int, world_size: int) -> list[str]:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return files[rank::world_size]


def rank_files(directory: str, rank: int, world_size: int, require_rows: bool) -> tuple[list[str], list[str]]:
    files = parquet_files(directory)
    if not files:
        raise FileNotFoundError(f"{directory} holds no parquet files: stage the data again")
    if require_rows and len(files) < world_size:
        raise ValueError(f"{directory} holds {len(files)} parquet file(s) for {world_size} processes, so some would "
                         f"get no data: stage it again for {world_size} processes")
    return files, files_for_rank(files, rank, world_size)


def read_shard(directory: str, rank: int, world_size: int, require_rows: bool = True):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, mine = rank_files(directory, rank, world_size, require_rows)
    tables = []
    for path in mine or files[:1]:  # no share: the split's columns, without rows
        with named_if_damaged(path):
            tables.append(pq.read_table(path) if mine else pq.read_schema(path).empty_table())
    return pa.concat_tables(tables)


@contextlib.contextmanager
def named_if_damaged(path: str):
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as error:  # a file cut short or overwritten
        raise ValueError(f"the staged file {path} is damaged ({str(error).splitlines()[0]}): stage the data again "
                         f"(delete {os.path.dirname(os.path.dirname(path))}; the next run stages it anew)") from None


def local_cache(staged_directory: str) -> str:
    root = LOCAL_DISK if os.access(os.path.dirname(LOCAL_DISK), os.W_OK) else tempfile.gettempdir()
    return os.path.join(root, "distributed-training-tokens", hashlib.sha256(staged_directory.encode()).hexdigest()[:16])


def mapped_tokens(directory: str, rank: int, world_size: int, dtype: str, require_rows: bool, local_copy: str):
    """This rank's token ids mapped from `local_copy`, written first if absent or damaged (earlier stagings' go)."""
    import numpy as np
    import pyarrow.parquet as pq

    itemsize = np.dtype(dtype).itemsize
    if copied_ids(local_copy, itemsize) is None:
        _, mine = rank_files(directory, rank, world_size, require_rows)

        def copy(file) -> None:
            for path in mine:
                with named_if_damaged(path):
                    staged = pq.ParquetFile(path, memory_map=True, buffer_size=1 << 20)
                    for batch in staged.iter_batches(batch_size=16, columns=["tokens"], use_threads=False):
                        for stream in batch.column(0):
                            file.write(stream.as_buffer())
            file.write((file.tell() // itemsize).to_bytes(COUNT_BYTES, "little"))

        stem = os.path.basename(local_copy).split("-", 1)[1]
        for earlier in glob.glob(os.path.join(os.path.dirname(local_copy), f"*-{stem}")):
            os.unlink(earlier)
        write_atomically(local_copy, copy)
    count = copied_ids(local_copy, itemsize)
    # copy-on-write: writable for torch, never written; an empty file cannot be mapped
    return np.memmap(local_copy, dtype=dtype, mode="c", shape=(count,)) if count else np.zeros(0, dtype=dtype)


def copied_ids(local_copy: str, itemsize: int) -> int | None:
    with contextlib.suppress(FileNotFoundError), open(local_copy, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(size - COUNT_BYTES, 0))
        count = int.from_bytes(file.read(), "little")
        return count if size == COUNT_BYTES + count * itemsize else None
    return None  # absent
