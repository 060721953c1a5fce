"""Staged data written straight with pyarrow, without Spark: for machines that have no pyspark (the GPU check) and
for data-path benchmarks that need more rows than a quick Spark staging gives.

A staged folder has the shape `staging.stage` writes (train/ and test/ with one parquet file per process, and the
manifest), with the statistics the task's `statistics` would compute, so the training loop cannot tell the
difference.
"""

from __future__ import annotations

import os
import random

LANGUAGE_TASK = "distributed_training.tasks.causal_lm"


def write_parts(folder: str, columns: dict, files: int) -> None:
    """The columns (equal-length numpy arrays or lists) as `files` parquet files of consecutive rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    table = pa.table(columns)
    for part, rows in enumerate(np.array_split(np.arange(table.num_rows), files)):
        pq.write_table(table.slice(rows[0], len(rows)) if len(rows) else table.slice(0, 0),
                       os.path.join(folder, f"part-{part:05d}.parquet"))


def fare_columns(rows: int, seed: int = 0) -> dict:
    """The fare task's prepared columns (float32 features and a fare that depends on them)."""
    import numpy as np

    from distributed_training.tasks.fare_regression import FEATURES, LABEL

    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
    fare = 15.0 + 4.0 * features @ rng.normal(size=len(FEATURES)) + rng.normal(0.0, 0.5, rows)
    return {**{name: features[:, index] for index, name in enumerate(FEATURES)}, LABEL: fare.astype(np.float32)}


def fare_statistics(columns: dict) -> dict:
    """What fare_regression.statistics computes: each column's mean and population standard deviation."""
    return {name: {"mean": float(values.mean()), "std": float(values.std()) or 1.0} for name, values in columns.items()}


def documents(count: int, seed: int = 0) -> list[str]:
    """TPC-H order comments, as the language task's sample table has them."""
    from distributed_training.tasks.causal_lm import tpch_comment

    rng = random.Random(seed)
    return [tpch_comment(rng) for _ in range(count)]


def text_statistics(texts: list[str]) -> dict:
    """What causal_lm.statistics computes: each byte's count, and one end-of-text token a document."""
    import numpy as np

    counts = np.bincount(np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8), minlength=256)
    token_counts = [*counts.tolist(), len(texts)]
    return {"token_counts": token_counts, "tokens": sum(token_counts), "documents": len(texts)}


def stage_text(directory: str, train: list[str], test: list[str], files: int):
    """The documents as a staged folder for the language task, `files` files a split (one per process), tokenized
    as staging does; its StagedData."""
    import numpy as np

    from distributed_training.tasks.causal_lm import Options, tokenize

    streams = {split: [tokenize({"text": share}, Options()) for share in np.array_split(np.array(texts, dtype=object),
                                                                                      files)]
               for split, texts in (("train", train), ("test", test))}
    return stage_tokens(directory, LANGUAGE_TASK, streams, (len(train), len(test)), text_statistics(train))


def stage_tokens(directory: str, task: str, streams: dict, rows: tuple[int, int], stats: dict):
    """Token streams ({"train": [ids of process 0, ...], "test": [...]}, numpy arrays of the staged dtype) as a staged
    folder of `task`, cut into rows as staging does; its StagedData. `rows`: the training and held-out rows."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    from distributed_training.data.staged import StagedData
    from distributed_training.data.staging import ROW_GROUP_BYTES, TOKENS_A_ROW

    (dtype,) = {tokens.dtype for split in streams.values() for tokens in split}
    for split, parts in streams.items():
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        for part, tokens in enumerate(parts):
            chunks = [tokens[start:start + TOKENS_A_ROW].tobytes() for start in range(0, len(tokens), TOKENS_A_ROW)]
            pq.write_table(pa.table({"tokens": pa.array(chunks, type=pa.binary())}),
                           os.path.join(directory, split, f"part-{part:05d}.parquet"),
                           row_group_size=ROW_GROUP_BYTES // (dtype.itemsize * TOKENS_A_ROW))
    staged = StagedData(directory=directory, task=task, source="synthetic", train_rows=rows[0], test_rows=rows[1],
                        files_per_split=len(streams["train"]), stats=stats, token_dtype=str(dtype),
                        staging_id=uuid.uuid4().hex)
    staged.save()
    return staged
