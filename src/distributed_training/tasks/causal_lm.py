"""The task: a GPT-style language model of a table's text column (predict the next byte of the text).

Everything this project trains is defined here; the loop, the launchers, checkpoints and MLflow know it only
through the names below (`Task` in task_interface.py, and the optional parts this task defines). To train on your own
text, pass --table and --text-column; to change the model, edit PRESETS or the classes below.

The model is a decoder-only transformer in the spirit of nanoGPT: pre-LayerNorm blocks of causal self-attention and
a GELU MLP, tied input and output embeddings, no dropout. Its tokens are the UTF-8 bytes of the text plus one
end-of-text token between documents, so nothing has to be downloaded. The default table, `samples.tpch.orders`,
exists in every Databricks workspace; its `o_comment` column is TPC-H's generated text. Quality is stated against
the unigram model: every token predicted with its frequency in the training split.
"""

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
# Some of the columns of samples.tpch.orders, as Spark DDL; the sample table has this schema.
ORDERS_SCHEMA = "o_orderkey bigint, o_custkey bigint, o_orderstatus string, o_orderpriority string, o_comment string"
END_OF_TEXT = 256  # between documents; the ids 0-255 are bytes
VOCAB_SIZE = 257
PADDED_VOCAB_SIZE = 320  # the embedding's rows, rounded up to a multiple of 64; those past VOCAB_SIZE never predicted
# (layers, heads, width, context tokens). gpt2-small has GPT-2 small's shape: about 85M parameters here, where
# GPT-2 has 124M because its 50,257-token vocabulary adds 38.6M of embedding.
PRESETS = {"tiny": (2, 4, 64, 64), "small": (6, 6, 384, 256), "gpt2-small": (12, 12, 768, 1024)}

# TPC-H's text grammar (specification 4.2.2.10) with shorter word lists. Capitals are phrases (sentence, noun, verb,
# prepositional); lower case letters are words (noun, verb, adjective, adverb d, preposition, auxiliary x).
GRAMMAR = {
    "S": ("N V", "N V P", "N V N", "N P V N", "N P V P"),
    "N": ("n", "a n", "a , a n", "d a n"),
    "V": ("v", "x v", "v d", "x v d"),
    "P": ("p the N",),
}
WORDS = {
    "n": ("foxes", "ideas", "theodolites", "pinto beans", "instructions", "dependencies", "excuses", "platelets",
          "asymptotes", "courts", "dolphins", "packages", "requests", "accounts", "deposits", "pearls", "warhorses"),
    "v": ("sleep", "wake", "are", "cajole", "haggle", "nag", "use", "boost", "affix", "detect", "integrate",
          "maintain", "nod", "lose", "solve", "thrash", "promise", "engage", "print", "x-ray", "breach", "doze"),
    "a": ("furious", "sly", "careful", "blithe", "quick", "fluffy", "slow", "quiet", "ruthless", "thin", "close",
          "dogged", "daring", "brave", "idle", "busy", "regular", "final", "ironic", "even", "bold", "special"),
    "d": ("sometimes", "always", "never", "furiously", "slyly", "carefully", "blithely", "quickly", "fluffily",
          "slowly", "quietly", "ruthlessly", "closely", "idly", "busily", "regularly", "finally", "ironically"),
    "p": ("about", "above", "according to", "across", "after", "against", "along", "among", "around", "at", "atop",
          "before", "behind", "beneath", "beside", "between", "beyond", "by", "despite", "during", "for", "from",
          "inside", "instead of", "into", "near", "of", "on", "outside", "over", "past", "since", "toward", "upon"),
    "x": ("do", "may", "might", "shall", "will", "would", "can", "could", "should", "must", "need to", "try to"),
}
TERMINATORS = (".", ";", ":", "?", "!", "--")


@dataclass(frozen=True)
class Options:
    text_column: str = field(default="o_comment", metadata={"help": "the table's column of text to model"})
    model_size: str = field(default="tiny", metadata={
        "help": "the transformer's shape: tiny (CPU tests), small, or gpt2-small (GPT-2 small's shape)",
        "choices": tuple(PRESETS)})


# ---------------------------------------------------------------- Spark side: from the table to documents

def expand(symbol: str, rng: random.Random) -> str:
    """A random phrase of the grammar for a phrase symbol, a random word for a word symbol, else the symbol."""
    if symbol in GRAMMAR:
        return " ".join(expand(part, rng) for part in rng.choice(GRAMMAR[symbol]).split())
    return rng.choice(WORDS[symbol]) if symbol in WORDS else symbol


def tpch_comment(rng: random.Random) -> str:
    """A sentence such as 'furiously regular deposits haggle slyly among the ironic requests.'"""
    return expand("S", rng).replace(" ,", ",") + rng.choice(TERMINATORS)


def sample_table(spark, seed: int, rows: int = 4000):
    """Orders with some of the default table's columns; the comments follow TPC-H's grammar, so a model can learn
    them and the unigram model cannot."""
    import numpy as np
    import pandas as pd

    rng, text_rng = np.random.default_rng(seed), random.Random(seed)
    orders = pd.DataFrame({
        "o_orderkey": np.arange(1, rows + 1, dtype="int64"),
        "o_custkey": rng.integers(1, 150_000, rows),
        "o_orderstatus": rng.choice(("F", "O", "P"), rows),
        "o_orderpriority": rng.choice(("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"), rows),
        "o_comment": [tpch_comment(text_rng) for _ in range(rows)],
    })
    return spark.createDataFrame(orders, schema=ORDERS_SCHEMA)


def prepare(table, options: Options, keep=()):
    """One row per non-empty document: the text column, named `text` (and the columns `keep`, as they are)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    column = options.text_column
    if column not in table.columns or not isinstance(table.schema[column].dataType, StringType):
        found = "lacks the column" if column not in table.columns else "has no string column"
        columns = ", ".join(f"{name} {kind}" for name, kind in table.dtypes)
        raise ValueError(f"the table {found} {column!r} to learn from; it has {columns}. Pass --text-column with "
                         f"one of its string columns, or --table with a table that has one")
    invalid = table.where(~F.is_valid_utf8(column)).count()  # found here: on the executors they end in a traceback
    if invalid:
        raise ValueError(f"the column {column!r} holds {invalid} value(s) that are not valid UTF-8: re-encode them as "
                         "UTF-8 (Spark SQL's make_valid_utf8 replaces what is not), or pass --text-column with another "
                         "column")
    text = F.col(column).alias("text")
    return table.select(text, *keep).where(F.col("text").isNotNull() & (F.length("text") > 0))


def statistics(train, options: Options) -> dict:
    """How often each token occurs in the training split: the unigram baseline's probabilities."""
    import numpy as np
    import pandas as pd

    def count_tokens(batches):  # self-contained, so the executors need not import this module
        for batch in batches:
            byte_counts = np.bincount(np.frombuffer("".join(batch["text"]).encode("utf-8"), dtype=np.uint8),
                                      minlength=256)
            yield pd.DataFrame({"counts": [[*byte_counts.tolist(), len(batch)]]})  # one END_OF_TEXT a document

    token_counts = [0] * VOCAB_SIZE
    for row in train.select("text").mapInPandas(count_tokens, "counts array<bigint>").collect():
        token_counts = [total + count for total, count in zip(token_counts, row["counts"])]
    return {"token_counts": token_counts, "tokens": sum(token_counts), "documents": token_counts[END_OF_TEXT]}


# ---------------------------------------------------------------- torch side: the model, its loss and its scores

def tokenize(rows, options: Options):
    """The documents of a batch of prepared rows (pandas) as one stream of token ids: each document's UTF-8 bytes,
    then END_OF_TEXT; uint16, as the vocabulary fits. Staging runs it on the executors, once."""
    import numpy as np

    # 0xFF never occurs in UTF-8, so it stands in for END_OF_TEXT while the documents are joined as bytes
    joined = b"".join(text.encode("utf-8") + b"\xff" for text in rows["text"])
    tokens = np.frombuffer(joined, dtype=np.uint8).astype(np.uint16)
    tokens[tokens == 0xFF] = END_OF_TEXT
    return tokens


def examples(tokens, stats: dict, options: Options) -> tuple:
    """(blocks,): this rank's token ids (memory-mapped) cut into blocks of context + 1 (the inputs and, one along,
    the targets), without a copy; the tokens after the last whole block are left out. No tokens (a rank's empty
    held-out share) make no blocks."""
    block_size = PRESETS[options.model_size][3] + 1
    if 0 < len(tokens) < block_size:
        raise ValueError(f"these rows hold {len(tokens)} tokens, fewer than one block of {block_size} for "
                         f"--model-size {options.model_size}: train on more rows or pick a smaller --model-size")
    blocks = len(tokens) // block_size
    return (torch.from_numpy(tokens[:blocks * block_size].reshape(blocks, block_size)),)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query_key_value = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        query, key, value = (part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                             for part in self.query_key_value(x).split(width, dim=2))
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return self.projection(attended.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(width), CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TiedHead(nn.Module):
    """The output layer, its weight the token embedding's: the logits of the VOCAB_SIZE tokens only. Slicing the
    padded vocabulary's logits instead returns a view, which FSDP2 warns may get wrong gradients."""

    def __init__(self, embedding):
        super().__init__()
        self.weight = embedding.weight

    def forward(self, x):
        return F.linear(x, self.weight[:VOCAB_SIZE])


class GPT(nn.Module):
    def __init__(self, layers: int, heads: int, width: int, context: int):
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(PADDED_VOCAB_SIZE, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.head = TiedHead(self.token_embedding)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # GPT-2: the residual stream's variance stays put however many layers add to it
            for projection in (block.attention.projection, block.mlp[2]):
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens):
        """(batch, length) token ids -> (batch, length, VOCAB_SIZE) logits of the next token"""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))


def count_parameters(model) -> int:
    """The model's parameters, the tied embedding counted once."""
    return sum(parameter.numel() for parameter in model.parameters())


def build_model(stats: dict, options: Options):
    return GPT(*PRESETS[options.model_size])


def loss(model, batch):
    """The mean cross-entropy of every next token, in float32 whatever precision the forward ran in."""
    blocks = batch[0].long()  # staged as uint16
    logits = model(blocks[:, :-1]).float()
    return F.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten())


def blocks(model) -> list:
    """The transformer's blocks: what --activation-checkpointing recomputes in the backward pass."""
    return list(model.blocks)


def count(batch) -> int:
    """The tokens the loss is the mean over: every block's targets."""
    (blocks,) = batch
    return blocks.shape[0] * (blocks.shape[1] - 1)


def flops_per_token(model, options: Options) -> int:
    """Training FLOPs per token (PaLM, appendix B): 6 for each weight that multiplies activations (2 forward, 4
    backward), the tied embedding counted once and the position embedding, only added, left out; plus 12 x layers x
    width x context for attention's scores and weighted sums (the causal mask's saving not subtracted)."""
    layers, _, width, context = PRESETS[options.model_size]
    matmul_weights = count_parameters(model) - model.position_embedding.weight.numel()
    return 6 * matmul_weights + 12 * layers * width * context


def unigram_log_probabilities(stats: dict):
    counts = torch.tensor(stats["token_counts"], dtype=torch.float64) + 1.0  # add-one: no token is impossible
    return (counts / counts.sum()).log()


def evaluate(model, batch, stats: dict) -> dict:
    """Summed negative log-likelihoods (nats) of the model and the unigram model on the same target tokens."""
    blocks = batch[0].long()
    targets = blocks[:, 1:]
    logits = model(blocks[:, :-1]).float()
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    baseline_nll = -unigram_log_probabilities(stats).to(targets.device)[targets].sum()
    return {"nll": float(nll), "baseline_nll": float(baseline_nll), "tokens": targets.numel(),
            "bytes": int((targets != END_OF_TEXT).sum())}


def summarize(sums: dict, stats: dict) -> dict:
    """Mean NLL per token (the loss) for the model and the baseline; perplexity; bits per byte of text (the
    end-of-text tokens' cost charged to the bytes)."""
    held_out = sums["nll"] / sums["tokens"]
    return {"held_out_loss": held_out, "baseline_loss": sums["baseline_nll"] / sums["tokens"],
            "perplexity": math.exp(held_out), "bits_per_byte": sums["nll"] / math.log(2) / sums["bytes"],
            "test_tokens": int(sums["tokens"])}


SCORES = "nll_per_byte double"


def score(model, rows, stats: dict, options: Options) -> dict:
    """Each prepared row's mean negative log-likelihood per byte (nats) of its first `context` bytes, read as a
    document starts (after an end-of-text token); lower is likelier."""
    texts = [text.encode("utf-8")[:model.context] for text in rows["text"]]
    lengths = torch.tensor([len(text) for text in texts])
    tokens = torch.full((len(texts), int(lengths.max()) + 1), END_OF_TEXT)
    for row, text in enumerate(texts):
        tokens[row, 1:len(text) + 1] = torch.tensor(list(text))
    tokens = tokens.to(next(model.parameters()).device)
    nll = F.cross_entropy(model(tokens[:, :-1]).float().transpose(1, 2), tokens[:, 1:], reduction="none").cpu()
    counted = torch.arange(nll.shape[1]) < lengths[:, None]
    return {"nll_per_byte": ((nll * counted).sum(1) / lengths).double().numpy()}


def exported_model(model, stats: dict, batch) -> tuple:
    """What MLflow logs: token ids in, next-token logits out; two held-out sequences of 16 tokens as its input
    example (end-of-text tokens where this rank has none)."""
    (blocks,) = batch
    tokens = blocks[0, :32].long() if len(blocks) else torch.full((32,), END_OF_TEXT)
    return model.eval(), tokens.reshape(2, 16).cpu().numpy()


def generate(model, prompt: str, max_new_tokens: int, temperature: float = 1.0, seed: int = 0) -> str:
    """The prompt and the model's continuation, sampled a byte at a time (temperature > 0) until end-of-text."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.tensor([[END_OF_TEXT, *prompt.encode("utf-8")]], device=device)  # as a document starts
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(tokens[:, -model.context:])[0, -1].float()
            token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)
            if token.item() == END_OF_TEXT:
                break
            tokens = torch.cat((tokens, token.view(1, 1)), dim=1)
    return bytes(tokens[0, 1:].tolist()).decode("utf-8", errors="replace")
