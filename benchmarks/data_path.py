"""The data path of every rank, each step against the simplest code that does the same work:

1. Reading: `read_shard` (a rank's staged files into one Table) against one plain `pyarrow.parquet.read_table` call
   over the same files, rows per second.
2. Text to token batches: the language task's own `tokenize` and `examples` (documents to blocks of token ids) and
   the loop's `ShuffledBatches` over one epoch, against numpy reading the documents' joined bytes as tokens and
   slicing a random permutation of the blocks by hand, tokens per second.
3. Batching: `ShuffledBatches` over one epoch of the fare task's tensors against a permutation sliced by hand.
"""

from __future__ import annotations

import os

from .measure import Row, alternate, seconds
from .synthetic import documents, fare_columns, write_parts

BATCH_SIZE = 64  # the loop's default: small batches are where a loader's cost per batch shows
FILES = 4


def run(work_dir: str, quick: bool) -> list[Row]:
    rows = 400_000 if quick else 2_000_000
    texts = 50_000 if quick else 200_000
    repetitions = 5 if quick else 9
    folder = os.path.join(work_dir, "data_path", "fare")
    write_parts(folder, fare_columns(rows), FILES)
    return [*_reading(folder, rows, repetitions), *_text_to_batches(work_dir, texts, repetitions),
            *_batching(min(rows, 200_000), repetitions)]


def _reading(folder: str, rows: int, repetitions: int) -> list[Row]:
    import pyarrow.parquet as pq

    from distributed_training.data.staged import parquet_files, read_shard

    files = parquet_files(folder)

    def rate(read) -> float:
        elapsed, table = seconds(read)
        assert table.num_rows == rows
        return rows / elapsed

    measured = alternate({"ours": lambda: rate(lambda: read_shard(folder, rank=0, world_size=1)),
                          "pyarrow": lambda: rate(lambda: pq.read_table(files))}, repetitions, warm_up=True)
    return [Row("data path", f"read {rows:,} staged rows in {len(files)} files (read_shard)", "rows/s",
                tuple(measured["ours"]), tuple(measured["pyarrow"]),
                "baseline: one pyarrow.parquet.read_table call over the same files")]


def _text_to_batches(work_dir: str, count: int, repetitions: int) -> list[Row]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from distributed_training.tasks import causal_lm
    from distributed_training.training.loop import ShuffledBatches

    folder = os.path.join(work_dir, "data_path", "text")
    write_parts(folder, {"text": documents(count)}, 1)
    table = pq.read_table(folder)
    options = causal_lm.Options()
    block_size = causal_lm.PRESETS[options.model_size][3] + 1

    def tokens_per_second(make_batches) -> float:
        def one_epoch() -> int:
            return sum(blocks.numel() for (blocks,) in make_batches())

        elapsed, tokens = seconds(one_epoch)
        return tokens / elapsed

    def ours():
        (blocks,) = causal_lm.examples(causal_lm.tokenize(table.to_pandas(), options), {}, options)
        batches = ShuffledBatches((blocks,), BATCH_SIZE, seed=0)
        batches.set_epoch(1)
        return iter(batches)

    def by_hand():
        joined = "\0".join(table.column("text").to_pylist()) + "\0"  # a separator after every document
        tokens = np.frombuffer(joined.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        whole = len(tokens) // block_size
        blocks = torch.from_numpy(tokens[:whole * block_size].reshape(whole, block_size))
        order = torch.randperm(whole, generator=torch.Generator().manual_seed(0))
        for start in range(0, whole, BATCH_SIZE):
            yield (blocks[order[start:start + BATCH_SIZE]],)

    measured = alternate({"ours": lambda: tokens_per_second(ours), "numpy": lambda: tokens_per_second(by_hand)},
                         repetitions, warm_up=True)
    return [Row("data path",
                f"{count:,} documents to shuffled token batches (causal_lm.tokenize, examples, ShuffledBatches)",
                "tokens/s", tuple(measured["ours"]), tuple(measured["numpy"]),
                f"blocks of {block_size} tokens, batches of {BATCH_SIZE}; baseline: numpy.frombuffer of the joined "
                "bytes, a permutation sliced by hand")]


def _batching(rows: int, repetitions: int) -> list[Row]:
    import torch

    from distributed_training.tasks.fare_regression import FEATURES
    from distributed_training.training.loop import ShuffledBatches

    features, labels = torch.randn(rows, len(FEATURES)), torch.randn(rows)

    def rows_per_second(batches) -> float:
        elapsed, count = seconds(lambda: sum(len(batch_labels) for _, batch_labels in batches))
        assert count == rows
        return rows / elapsed

    def by_hand():
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
        for start in range(0, rows, BATCH_SIZE):
            chosen = order[start:start + BATCH_SIZE]
            yield features[chosen], labels[chosen]

    measured = alternate({
        "ours": lambda: rows_per_second(ShuffledBatches((features, labels), BATCH_SIZE, seed=0)),
        "by hand": lambda: rows_per_second(by_hand()),
    }, repetitions, warm_up=True)
    return [Row("data path", f"one epoch of {rows:,} fare rows in shuffled batches of {BATCH_SIZE} (ShuffledBatches)",
                "rows/s", tuple(measured["ours"]), tuple(measured["by hand"]),
                "baseline: a random permutation sliced by hand")]
