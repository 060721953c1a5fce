"""Bring your own model, a worked example: `task.py` changed into another language model. Nothing else changes.

The question: how well does a small recurrent network (a GRU) predict the next byte of the same text column? Against
task.py's transformer it changes the model (build_model: an embedding, a GRU, a linear head), its options (--width,
--layers, --context) and the baseline (the bigram model: each byte predicted from the one before, which a model of
the text must beat, where task.py states the unigram model). Try it as it is:

    PYTHONPATH=. python -m {{ cookiecutter.package_name }} train --engine {{ (torch_engines(cookiecutter) + ["torch_distributor"])[0] }} --local --task examples.recurrent_language_model

then make it yours: copy it over src/{{ cookiecutter.package_name }}/task.py, or edit task.py the same way.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ModuleNotFoundError:  # the serverless stage task prepares the data with Spark alone: it has no torch
    torch = F = None
    nn = type("nn", (), {"Module": object})

DEFAULT_TABLE = "samples.tpch.orders"
END_OF_TEXT, VOCAB_SIZE = 256, 257  # the ids 0-255 are the UTF-8 bytes of the text
WORDS = ("furiously", "regular", "deposits", "haggle", "slyly", "among", "the", "ironic", "requests", "packages")


@dataclass(frozen=True)
class Options:
    text_column: str = field(default="o_comment", metadata={"help": "the table's column of text to model"})
    width: int = field(default=64, metadata={"help": "the GRU's width"})
    layers: int = field(default=1, metadata={"help": "the GRU's layers"})
    context: int = field(default=32, metadata={"help": "the bytes of text a training example holds"})


def sample_table(spark, seed: int, rows: int = 8000):
    """Orders with the default table's text column: sentences of a few words in an order a model can learn."""
    rng = random.Random(seed)
    comments = [" ".join(WORDS[start:start + rng.randint(3, 6)]) + "." for start in
                (rng.randrange(len(WORDS) - 3) for _ in range(rows))]
    return spark.createDataFrame([(key, comment) for key, comment in enumerate(comments)], "o_orderkey bigint, "
                                 "o_comment string")


def prepare(table, options: Options, keep=()):
    from pyspark.sql import functions as F

    text = F.col(options.text_column).alias("text")
    return table.select(text, *keep).where(F.col("text").isNotNull() & (F.length("text") > 0))


def statistics(train, options: Options) -> dict:
    """How often each token follows each other (END_OF_TEXT before a document's first byte): the bigram baseline."""
    import numpy as np
    import pandas as pd

    def count_pairs(batches):  # self-contained, so the executors need not import this module
        for batch in batches:
            tokens = np.frombuffer(b"".join(b"\xff" + text.encode("utf-8") for text in batch["text"]) + b"\xff",
                                   dtype=np.uint8).astype(np.int64)
            tokens[tokens == 0xFF] = 256  # END_OF_TEXT: 0xFF never occurs in UTF-8
            yield pd.DataFrame({"counts": [np.bincount(tokens[:-1] * 257 + tokens[1:], minlength=257 * 257)]})

    counts = sum(np.array(row["counts"]) for row in train.select("text").mapInPandas(
        count_pairs, "counts array<bigint>").collect())
    return {"bigram_counts": np.asarray(counts).reshape(VOCAB_SIZE, VOCAB_SIZE).tolist()}


def tokenize(rows, options: Options):
    """The documents as one stream of token ids: each document's UTF-8 bytes, then END_OF_TEXT."""
    import numpy as np

    return np.array([token for text in rows["text"] for token in (*text.encode("utf-8"), END_OF_TEXT)],
                    dtype=np.uint16)


def examples(tokens, stats: dict, options: Options) -> tuple:
    """Blocks of context + 1 token ids: the inputs and, one along, the targets."""
    blocks = len(tokens) // (options.context + 1)
    return (torch.from_numpy(tokens[:blocks * (options.context + 1)].reshape(blocks, options.context + 1)),)


class RecurrentLanguageModel(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB_SIZE, width)
        self.recurrent = nn.GRU(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, VOCAB_SIZE)

    def forward(self, tokens):
        """(batch, length) token ids -> (batch, length, VOCAB_SIZE) logits of the next token"""
        hidden, _ = self.recurrent(self.embedding(tokens))
        return self.head(hidden)


def build_model(stats: dict, options: Options):
    return RecurrentLanguageModel(options.width, options.layers)


def loss(model, batch):
    blocks = batch[0].long()  # staged as uint16
    logits = model(blocks[:, :-1]).float()
    return F.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten())


def count(batch) -> int:
    """The tokens the loss is the mean over: every block's targets."""
    return batch[0].shape[0] * (batch[0].shape[1] - 1)


def evaluate(model, batch, stats: dict) -> dict:
    """Summed negative log-likelihoods (nats) of the model and of the bigram model on the same target tokens."""
    blocks = batch[0].long()
    inputs, targets = blocks[:, :-1], blocks[:, 1:]
    counts = torch.tensor(stats["bigram_counts"], dtype=torch.float64, device=blocks.device) + 1.0  # add-one
    bigram = (counts / counts.sum(1, keepdim=True)).log()
    return {"nll": float(F.cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten(), reduction="sum")),
            "baseline_nll": float(-bigram[inputs, targets].sum()), "tokens": targets.numel()}


def summarize(sums: dict, stats: dict) -> dict:
    held_out = sums["nll"] / sums["tokens"]
    return {"held_out_loss": held_out, "baseline_loss": sums["baseline_nll"] / sums["tokens"],
            "perplexity": math.exp(held_out), "test_tokens": int(sums["tokens"])}


def exported_model(model, stats: dict, batch) -> tuple:
    """What MLflow logs: token ids in, next-token logits out; a held-out block as its input example."""
    (blocks,) = batch
    tokens = blocks[:1, :-1].long() if len(blocks) else torch.full((1, 16), END_OF_TEXT)  # a rank without any
    return model.eval(), tokens.cpu().numpy()
