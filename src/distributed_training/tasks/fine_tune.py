"""The task: fine-tune a pretrained Hugging Face causal language model (Llama, Qwen, Mistral, GPT-2, ...) on a table's
text, in full or with LoRA adapters (peft).

Everything this project trains is defined here; the loop, the launchers, checkpoints and MLflow know it only through
the names below (`Task` in task_interface.py, and the optional parts this task defines). The model and its tokenizer
come from --base-model, a folder in Hugging Face format (config.json, the weights, the tokenizer's files), loaded with
`from_pretrained`: a Unity Catalog volume's path on Databricks (/Volumes/catalog/schema/volume/Llama-3.2-1B), a
local folder here. A Hub id works only where the cluster reaches huggingface.co.

Two kinds of data:
- continued pre-training (the default): the loss on every token of --text-column;
- supervised fine-tuning (--prompt-column and --response-column): the loss on the response's tokens only. With the
  tokenizer's chat template, where it has one, the prompt is the user's turn and the response the assistant's;
  without, the prompt and a newline, then the response and the end-of-sequence token, each tokenized on its own.

Sequences become batches by packing (the default: examples one after another, cut into blocks of --max-length, no
token wasted; attention runs across an example's end inside a block) or padding (one example a block, cut at
--max-length, the rest padding that costs compute but no loss). Quality is stated against the unigram model of the
training split's tokens (the trivial predictor), and the run reports the base model's own held-out loss at its start.
"""

import copy
import functools
import math
import os
import random
from dataclasses import dataclass, field

try:
    import torch
    from torch.nn import functional as F
except ModuleNotFoundError:  # the serverless stage task prepares the data with Spark alone: it has no torch
    torch = F = None

DEFAULT_TABLE = "samples.tpch.orders"  # in every workspace: its o_comment column is TPC-H's generated text
IGNORED = -100  # a target the loss skips (cross_entropy's ignore_index)
# The attention and MLP projections LoRA adapts by default, by the model's `model_type` (its config.json). Others:
# pass --lora-targets.
LORA_TARGETS = {
    "llama": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "mistral": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "qwen2": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "qwen3": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "gemma": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "gpt2": "c_attn,c_proj,c_fc",
}


@dataclass(frozen=True)
class Options:
    base_model: str = field(default="", metadata={
        "help": "the pretrained model: a folder in Hugging Face format, e.g. /Volumes/main/default/models/Llama-3.2-1B "
                "(a Hub id only where the cluster reaches huggingface.co)"})
    text_column: str = field(default="o_comment", metadata={
        "help": "continued pre-training: the table's column of text (unused with --prompt-column)"})
    prompt_column: str = field(default="", metadata={
        "help": "supervised fine-tuning: the column of prompts (with --response-column; the loss skips them)"})
    response_column: str = field(default="", metadata={"help": "supervised fine-tuning: the column of responses"})
    max_length: int = field(default=512, metadata={"help": "tokens in a training sequence"})
    packing: str = field(default="pack", metadata={
        "help": "pack: examples one after another in blocks of --max-length (no padding); pad: one example a block",
        "choices": ("pack", "pad")})
    lora_rank: int = field(default=16, metadata={"help": "LoRA's rank; 0 fine-tunes every weight"})
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA's scale is alpha / rank"})
    lora_dropout: float = field(default=0.05, metadata={"help": "dropout on LoRA's input"})
    lora_targets: str = field(default="", metadata={
        "help": "the modules LoRA adapts, comma-separated (default: the attention and MLP projections of the model's "
                "family)"})
    merge_adapters: bool = field(default=False, metadata={
        "help": "with LoRA, also save the model with its adapters merged into the weights (a full copy of the model, "
                "in hf_model/merged/) for a server that cannot load adapters"})


# ---------------------------------------------------------------- Spark side: from the table to token ids

# A small grammar: "the <adjective> <noun> <verb> <preposition> the <noun>." in the sample table's o_comment
WORDS = {"adjective": ("red", "blue", "green", "quick", "slow"), "noun": ("fox", "dog", "cat", "bird", "tree"),
         "verb": ("runs", "jumps", "sleeps", "sings"), "preposition": ("over", "under", "near", "by")}


def sentence(rng: random.Random) -> str:
    adjective, noun, verb, preposition, other = (rng.choice(WORDS[kind]) for kind in
                                                 ("adjective", "noun", "verb", "preposition", "noun"))
    return f"the {adjective} {noun} {verb} {preposition} the {other}."


def sample_table(spark, seed: int, rows: int = 2000):
    """Orders whose o_comment is a sentence of a small grammar, and pairs of an `instruction` to reverse a few words
    and its `response`: text a small model learns in minutes (for --prompt-column instruction --response-column
    response)."""
    import pandas as pd

    rng = random.Random(seed)
    nouns = [[rng.choice(WORDS["noun"]) for _ in range(rng.randint(2, 4))] for _ in range(rows)]
    table = pd.DataFrame({"o_orderkey": range(1, rows + 1), "o_comment": [sentence(rng) for _ in range(rows)],
                          "instruction": ["Reverse: " + " ".join(chosen) for chosen in nouns],
                          "response": [" ".join(reversed(chosen)) for chosen in nouns]})
    return spark.createDataFrame(table, schema="o_orderkey bigint, o_comment string, instruction string, "
                                               "response string")


def supervised(options: Options) -> bool:
    return bool(options.prompt_column or options.response_column)


def prepare(table, options: Options, keep=()):
    """One row per example: `text`, or `prompt` and `response` (and the columns `keep`, as they are)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    if not options.base_model:
        raise ValueError("no --base-model: pass the folder of a pretrained model in Hugging Face format (on "
                         "Databricks a volume's path, /Volumes/<catalog>/<schema>/<volume>/<model>)")
    if supervised(options) and not (options.prompt_column and options.response_column):
        raise ValueError("supervised fine-tuning takes both --prompt-column and --response-column")
    wanted = ({"prompt": options.prompt_column, "response": options.response_column} if supervised(options) else
              {"text": options.text_column})
    for name, column in wanted.items():
        if column not in table.columns or not isinstance(table.schema[column].dataType, StringType):
            found = "lacks the column" if column not in table.columns else "has no string column"
            columns = ", ".join(f"{name} {kind}" for name, kind in table.dtypes)
            raise ValueError(f"the table {found} {column!r} for the {name}; it has {columns}. Pass "
                             f"--{'text' if name == 'text' else name}-column with one of its string columns")
    chosen = table.select(*(F.col(column).alias(name) for name, column in wanted.items()), *keep)
    return chosen.where(" and ".join(f"{name} is not null and length({name}) > 0" for name in wanted))


@functools.lru_cache(maxsize=2)
def tokenizer_of(base_model: str):
    """The base model's tokenizer, once per process (staging's Python workers and the ranks)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(base_model)
    except OSError as error:  # no such folder, or one without a tokenizer; a Hub id the cluster cannot reach
        raise ValueError(f"cannot load the tokenizer of --base-model {base_model!r} ({str(error).splitlines()[0]}): "
                         "pass a folder in Hugging Face format that holds the tokenizer's files (save_pretrained "
                         "writes them); a Hub id needs the cluster to reach huggingface.co") from None


def staged_dtype(vocabulary: int) -> str:
    """The ids' type as staged: the top bit marks a target the loss skips, so uint16 holds 32,768 ids, uint32 the rest
    (Llama 3's 128,256)."""
    return "uint16" if vocabulary <= 1 << 15 else "uint32"


def example_ids(tokenizer, row, options: Options) -> tuple[list[int], int]:
    """An example's token ids and how many at its start the loss skips (the prompt)."""
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if not supervised(options):
        ids = tokenizer(row["text"])["input_ids"]
        return ids + end if ids[-len(end):] != end else ids, 0
    if tokenizer.chat_template:
        turns = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]
        prompt = tokenizer.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
        whole = tokenizer.apply_chat_template(turns, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
        return ids, len(prompt_ids) if ids[:len(prompt_ids)] == prompt_ids else len(prompt_ids) - 1
    prompt_ids = tokenizer(row["prompt"] + "\n")["input_ids"]
    return prompt_ids + tokenizer(row["response"], add_special_tokens=False)["input_ids"] + end, len(prompt_ids)


def tokenize(rows, options: Options):
    """A batch of prepared rows (pandas) as one stream of token ids in the staged dtype, the top bit set on what the
    loss skips (prompts, padding). Packed: the examples one after another; padded: each cut or padded to one block of
    max_length + 1 (a block's inputs and, one along, its targets). Staging runs it on the executors, once."""
    import numpy as np

    tokenizer = tokenizer_of(options.base_model)
    dtype = np.dtype(staged_dtype(len(tokenizer)))
    skip = 1 << (8 * dtype.itemsize - 1)
    block = options.max_length + 1
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    streams = []
    for row in rows.to_dict("records"):
        ids, skipped = example_ids(tokenizer, row, options)
        flags = np.zeros(len(ids), dtype=dtype)
        flags[:skipped] = skip
        example = np.asarray(ids, dtype=dtype) | flags
        if options.packing == "pad":
            example = np.concatenate((example[:block], np.full(max(block - len(example), 0), pad | skip, dtype)))
        streams.append(example)
    return np.concatenate(streams) if streams else np.zeros(0, dtype)


def statistics(train, options: Options) -> dict:
    """How often each token is a target in the training split: the unigram baseline's probabilities."""
    import numpy as np
    import pandas as pd

    vocabulary = len(tokenizer_of(options.base_model))

    def count_tokens(batches):
        for batch in batches:
            tokens = tokenize(batch, options)
            skip = 1 << (8 * tokens.dtype.itemsize - 1)
            counts = np.bincount(tokens[tokens < skip].astype(np.int64), minlength=vocabulary)
            yield pd.DataFrame({"counts": [counts.tolist()]})

    token_counts = np.zeros(vocabulary, dtype=np.int64)
    for row in train.mapInPandas(count_tokens, "counts array<bigint>").collect():
        token_counts += np.asarray(row["counts"], dtype=np.int64)
    return {"token_counts": token_counts.tolist(), "tokens": int(token_counts.sum()), "vocabulary": vocabulary}


# ---------------------------------------------------------------- torch side: the model, its loss and its scores

def examples(tokens, stats: dict, options: Options) -> tuple:
    """(blocks,): this rank's staged ids (memory-mapped) as blocks of max_length + 1, read as signed integers of the
    same width, without a copy (a skipped target is then negative); the ids after the last whole block are left out."""
    import numpy as np

    block = options.max_length + 1
    if 0 < len(tokens) < block:
        raise ValueError(f"these rows hold {len(tokens)} tokens, fewer than one block of {block}: train on more rows "
                         "or lower --max-length")
    signed = tokens.view(np.int16 if tokens.dtype.itemsize == 2 else np.int32)
    blocks = len(signed) // block
    return (torch.from_numpy(signed[:blocks * block].reshape(blocks, block)),)


def inputs_and_targets(batch):
    """A batch's input ids, and its target ids with IGNORED where the loss skips them."""
    (blocks,) = batch
    skipped = blocks < 0
    ids = (blocks & torch.iinfo(blocks.dtype).max).long()
    return ids[:, :-1], ids[:, 1:].masked_fill(skipped[:, 1:], IGNORED)


def target_nll(model, batch):
    """The summed negative log-likelihood of a batch's targets, in float32, and their number."""
    inputs, targets = inputs_and_targets(batch)
    logits = model(input_ids=inputs, use_cache=False).logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED, reduction="sum")
    return nll, (targets != IGNORED).sum()


def build_model(stats: dict, options: Options):
    """The base model in float32 (the loop's precision autocasts), with LoRA adapters where --lora-rank > 0."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar a rank, each loading the same weights
    try:
        if torch.get_default_device().type == "meta":  # the structure alone: rank 0's weights fill it (the loop)
            config = AutoConfig.from_pretrained(options.base_model)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(options.base_model, dtype=torch.float32)
    except OSError as error:
        raise ValueError(f"cannot load --base-model {options.base_model!r} ({str(error).splitlines()[0]}): pass a "
                         "folder in Hugging Face format (config.json and the weights)") from None
    return with_adapters(model, options)


def with_adapters(model, options: Options):
    """The model with LoRA adapters where --lora-rank > 0, else as it is."""
    if options.lora_rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    targets = options.lora_targets or LORA_TARGETS.get(model.config.model_type)
    if not targets:
        raise ValueError(f"no default LoRA targets for a {model.config.model_type!r} model: pass --lora-targets "
                         "(the names of its attention and MLP projection modules, comma-separated)")
    adapters = LoraConfig(r=options.lora_rank, lora_alpha=options.lora_alpha, lora_dropout=options.lora_dropout,
                          target_modules=targets.split(","), task_type="CAUSAL_LM",
                          fan_in_fan_out=model.config.model_type == "gpt2")  # GPT-2's Conv1D holds its weights (in, out)
    return get_peft_model(model, adapters)


def loss(model, batch):
    """The mean cross-entropy of the targets the loss counts (0 for a batch with none)."""
    nll, counted = target_nll(model, batch)
    return nll / counted.clamp(min=1)


def count(batch):
    """The targets the loss is the mean over (a tensor: the loop sums them on the device)."""
    return (inputs_and_targets(batch)[1] != IGNORED).sum()


def decoder(model):
    """The transformers model under the LoRA wrapper, if any."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def blocks(model) -> list:
    """The decoder layers: what --activation-checkpointing recomputes and FSDP2 shards one by one."""
    layers = decoder(model).config.num_hidden_layers
    found = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList) and len(module) == layers]
    return list(found[0]) if found else [model]


def flops_per_token(model, options: Options) -> int:
    """Training FLOPs per token (PaLM, appendix B): 6 per weight that multiplies activations (the input embedding,
    only looked up, left out; LoRA: 4 per frozen weight, whose weight gradient is never formed), plus 12 x layers x
    width x context for attention."""
    base = decoder(model)
    embedding = base.get_input_embeddings().weight
    tied = base.get_output_embeddings() is not None and base.get_output_embeddings().weight is embedding
    matmuls = [p for p in model.parameters() if p is not embedding or tied]
    config = base.config
    return (sum((6 if p.requires_grad else 4) * p.numel() for p in matmuls)
            + 12 * config.num_hidden_layers * config.hidden_size * options.max_length)


def unigram_log_probabilities(stats: dict):
    counts = torch.tensor(stats["token_counts"], dtype=torch.float64) + 1.0  # add-one: no token is impossible
    return (counts / counts.sum()).log()


def evaluate(model, batch, stats: dict) -> dict:
    """Summed negative log-likelihoods (nats) of the model and the unigram model on the same counted targets."""
    nll, counted = target_nll(model, batch)
    _, targets = inputs_and_targets(batch)
    kept = targets[targets != IGNORED]
    baseline_nll = -unigram_log_probabilities(stats).to(kept.device)[kept].sum()
    return {"nll": float(nll), "baseline_nll": float(baseline_nll), "tokens": int(counted)}


def summarize(sums: dict, stats: dict) -> dict:
    """Mean NLL per counted token for the model and the baseline, and the model's perplexity."""
    tokens = max(sums["tokens"], 1)
    held_out = sums["nll"] / tokens
    return {"held_out_loss": held_out, "baseline_loss": sums["baseline_nll"] / tokens,
            "perplexity": math.exp(min(held_out, 700.0)), "test_tokens": int(sums["tokens"])}


SCORES = "nll_per_token double"


def score(model, rows, stats: dict, options: Options) -> dict:
    """Each prepared row's mean negative log-likelihood per counted token (nats): its text's, or its response's given
    its prompt, the first max_length + 1 tokens; lower is likelier."""
    tokenizer = tokenizer_of(options.base_model)
    examples = [example_ids(tokenizer, row, options) for row in rows.to_dict("records")]
    length = min(max(len(ids) for ids, _ in examples), options.max_length + 1)
    ids = torch.zeros((len(examples), length), dtype=torch.long)
    counted = torch.zeros((len(examples), length), dtype=torch.bool)
    for row, (example, skipped) in enumerate(examples):
        example = example[:length]
        ids[row, :len(example)] = torch.tensor(example)
        counted[row, max(skipped, 1):len(example)] = True  # the first token is never a target
    logits = model(input_ids=ids[:, :-1].to(next(model.parameters()).device), use_cache=False).logits.float()
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:].to(logits.device), reduction="none").cpu()
    targets = counted[:, 1:]
    return {"nll_per_token": ((nll * targets).sum(1) / targets.sum(1).clamp(min=1)).double().numpy()}


class NextTokenLogits(torch.nn.Module if torch else object):
    """The model as MLflow's pytorch flavour logs it: token ids in, the next token's logits out (one tensor)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def exported_model(model, stats: dict, batch) -> tuple:
    """What MLflow logs: the model (token ids in, logits out) and two held-out sequences of 8 ids as its example."""
    inputs, _ = inputs_and_targets(batch)
    example = inputs[:2, :8] if len(inputs) >= 2 else torch.zeros((2, 8), dtype=torch.long)
    return NextTokenLogits(model).eval(), example.cpu().numpy()


MERGED_DIR = "merged"  # in the run's Hugging Face folder: the LoRA model merged (--merge-adapters)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")  # what a saved tokenizer leaves


def save_pretrained(model, folder: str, options: Options) -> None:
    """The trained model in Hugging Face format, with the base model's tokenizer where it has one (one whose ids were
    staged by other means, as the GPU check's, may not): in full, the model (safetensors, config.json,
    generation_config.json); with LoRA, the adapters (adapter_model.safetensors, and adapter_config.json, whose
    base_model_name_or_path is --base-model), and with --merge-adapters the merged model in MERGED_DIR too."""
    base = options.base_model
    has_tokenizer = not os.path.isdir(base) or any(os.path.exists(os.path.join(base, name)) for name in TOKENIZER_FILES)
    tokenizer = tokenizer_of(base) if has_tokenizer else None
    model.save_pretrained(folder)
    if tokenizer:
        tokenizer.save_pretrained(folder)
    if options.lora_rank and options.merge_adapters:
        merged = os.path.join(folder, MERGED_DIR)
        copy.deepcopy(model).merge_and_unload().save_pretrained(merged)  # a copy: merging changes the model in place
        if tokenizer:
            tokenizer.save_pretrained(merged)


# ---------------------------------------------------------------- a small model, to try the task without a download

def save_small_model(folder: str, texts: list[str], family: str = "llama", vocabulary: int = 512, seed: int = 0):
    """A small random-weight model of a family ("llama", "qwen2" or "gpt2") and a byte-level BPE tokenizer trained on
    `texts`, saved with save_pretrained into `folder` (what --base-model reads)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocabulary, special_tokens=["<s>", "</s>", "<pad>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>")
    shape = dict(vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1, pad_token_id=2)
    config = {
        "llama": lambda: transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=1024, **shape),
        "qwen2": lambda: transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=1024, tie_word_embeddings=True, **shape),
        "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=1024, resid_pdrop=0.0,
                                                embd_pdrop=0.0, attn_pdrop=0.0, **shape),  # no dropout, as Llama
    }[family]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer
