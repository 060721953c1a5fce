"""Training memory per GPU: weights, gradients, optimizer states and activations, in GB (10^9 bytes).

The accounting is the usual mixed-precision bookkeeping (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"), for a model of P parameters:

- weights: 2 bytes a parameter in bf16 or fp16, 4 in fp32.
- gradients: as many bytes as the weights.
- optimizer states, kept in fp32: Adam's two moments are 8 bytes a parameter, SGD's momentum 4, plain SGD 0.
  Mixed precision (bf16, fp16) adds the fp32 master copy of the weights (4 bytes), so Adam in bf16 is 12 bytes a
  parameter and a bf16 model with Adam needs 2 + 2 + 12 = 16 bytes a parameter before activations.
- ZeRO stage 1 shards the optimizer states over the data-parallel GPUs, stage 2 the gradients too, stage 3 the
  weights too: each sharded term is divided by the number of GPUs. CPU offload moves the optimizer states (and,
  in stage 3, the weights) into host memory, sharded the same way.
- FSDP2 (torch's fully_shard) shards everything, as ZeRO 3 does, but keeps the weights and gradients themselves in
  fp32 (4 + 4 bytes a parameter, no separate master copy) and gathers 16-bit copies one layer at a time: with Adam
  4 + 4 + 8 = 16 bytes a parameter in any precision, divided by the number of GPUs. Under LoRA it shards the frozen
  base in the precision's width and the fp32 adapter with its gradients and moments. The gathered layer is left to
  the headroom.
- fine-tuning a pretrained transformer in full trains every weight: the same terms as training from scratch.
- LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") freezes the base and trains, beside
  each targeted projection of shape (in, out), the matrices A (in x r) and B (r x out): r*(in + out) parameters.
  The targets are the attention and MLP projections of each Llama-shaped decoder layer: q (h, h), k and v (h, kv),
  o (h, h), gate and up (h, I), down (I, h), with h the hidden size, kv = KV heads x h / heads (grouped-query
  attention) and I the MLP's width, so a layer's adapters hold r*(9h + 2kv + 3I) parameters. The frozen base holds
  its weights alone (2 bytes a parameter in 16-bit, 4 in fp32): no gradients, no optimizer state. The adapter
  trains in fp32 whatever the precision (peft's get_peft_model casts 16-bit adapters to fp32:
  autocast_adapter_dtype): 4 bytes of weights, 4 of gradients and the optimizer's moments. ZeRO shards the
  adapter's terms as it shards a whole model's, and at stage 3 the frozen base too.
- activations of a transformer: per layer s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations and no
  recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"), where
  s = sequence length, b = micro-batch per GPU, h = hidden size, a = attention heads. The 5*a*s/h part is the
  attention score matrices: a fused attention kernel (FlashAttention, PyTorch SDPA) never stores them, so
  `flash_attention` drops it. The formula assumes a 4h GELU MLP and full multi-head attention; for SwiGLU or
  grouped-query attention (Llama) it is an approximation. With full activation checkpointing each layer keeps
  only its 16-bit input (2*s*b*h bytes) and one layer's activations are rebuilt at a time during the backward
  pass. In fp32 every figure doubles. When the vocabulary V is known, the output logits add s*b*V*4 bytes (the
  loss is taken in fp32). A frozen base stores the same activations as a trained one: the backward pass runs
  through it to reach the adapters. LoRA's own (the r-wide products) are left out, and so is the copy of each
  targeted projection's input that a LoRA dropout above 0 keeps.
- activations of an MLP on tabular data, per sample: the input features plus each hidden layer's values before
  and after its nonlinearity, (features + 2*layers*hidden) values of 2 (bf16, fp16) or 4 (fp32) bytes.
- headroom: the sum times 1.20 (CUDA context, the allocator's fragmentation, temporary buffers) must not exceed
  the GPU's memory. The catalog lists GPU memory in nominal GB (really GiB), so the comparison errs on the safe
  side. Host memory that takes offloaded states gets the same headroom.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9
HEADROOM = 1.20
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adam", "sgd-momentum", "sgd")
TRANSFORMER, MLP = "transformer", "mlp"
FULL, LORA = "full", "lora"
FINE_TUNES = (FULL, LORA)
DEFAULT_LORA_RANK = 16

_WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_MOMENT_BYTES = {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0}
_MOMENT_NAMES = {"adamw": "AdamW m, v", "adam": "Adam m, v", "sgd-momentum": "SGD momentum", "sgd": "no SGD state"}
_MASTER_WEIGHT_BYTES = 4
_ADAPTER_BYTES = 4  # fp32 adapter weights, and their gradients
_LOGIT_BYTES = 4
_COUNT_SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
MAX_PARAMS = 1e15  # 1,000T: 16 PB of training state, far beyond any cluster `advise` sizes
OFFLOADS = ("none", "optimizer", "optimizer+weights")


@dataclass(frozen=True)
class ModelShape:
    params: float
    kind: str  # TRANSFORMER or MLP
    layers: int
    hidden: int
    heads: int | None = None  # transformer
    vocab: int | None = None  # transformer, optional: output logits are counted when known
    kv_heads: int | None = None  # grouped-query attention's key/value heads; None: as many as heads
    intermediate: int | None = None  # a Llama-shaped (gated) MLP's width: LoRA's adapters are counted from it
    features: int | None = None  # MLP input width
    name: str | None = None


# Well-known transformer shapes and their parameter counts. The Llamas' shapes are those of their config.json on
# huggingface.co (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, intermediate_size,
# vocab_size): meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Llama-2-70b-hf (llama-7b, 13b and 70b), Llama-3.2-1B (its
# output layer shares the embedding's weights: tie_word_embeddings), Llama-3.1-8B and Llama-3.1-70B; their counts
# are those of transformers' LlamaForCausalLM built from them.
NAMED_MODELS = {
    shape.name: shape for shape in (
        ModelShape(124_439_808, TRANSFORMER, layers=12, hidden=768, heads=12, vocab=50257, name="gpt2"),
        ModelShape(354_823_168, TRANSFORMER, layers=24, hidden=1024, heads=16, vocab=50257, name="gpt2-medium"),
        ModelShape(774_030_080, TRANSFORMER, layers=36, hidden=1280, heads=20, vocab=50257, name="gpt2-large"),
        ModelShape(1_557_611_200, TRANSFORMER, layers=48, hidden=1600, heads=25, vocab=50257, name="gpt2-xl"),
        ModelShape(1_315_758_080, TRANSFORMER, layers=24, hidden=2048, heads=32, vocab=50272, name="opt-1.3b"),
        ModelShape(6_738_415_616, TRANSFORMER, layers=32, hidden=4096, heads=32, vocab=32000, kv_heads=32,
                   intermediate=11008, name="llama-7b"),
        ModelShape(13_015_864_320, TRANSFORMER, layers=40, hidden=5120, heads=40, vocab=32000, kv_heads=40,
                   intermediate=13824, name="llama-13b"),
        ModelShape(68_976_648_192, TRANSFORMER, layers=80, hidden=8192, heads=64, vocab=32000, kv_heads=8,
                   intermediate=28672, name="llama-70b"),
        ModelShape(1_235_814_400, TRANSFORMER, layers=16, hidden=2048, heads=32, vocab=128256, kv_heads=8,
                   intermediate=8192, name="llama-3.2-1b"),
        ModelShape(8_030_261_248, TRANSFORMER, layers=32, hidden=4096, heads=32, vocab=128256, kv_heads=8,
                   intermediate=14336, name="llama-3.1-8b"),
        ModelShape(70_553_706_496, TRANSFORMER, layers=80, hidden=8192, heads=64, vocab=128256, kv_heads=8,
                   intermediate=28672, name="llama-3.1-70b"),
    )
}


def mlp_params(features: int, hidden: int, layers: int) -> int:
    """Weights and biases of an MLP with `layers` hidden layers of width `hidden` and one output."""
    return features * hidden + hidden + (layers - 1) * (hidden * hidden + hidden) + hidden + 1


def kv_width(model: ModelShape) -> int:
    """The output width of the key and of the value projection: KV heads x head size."""
    return (model.kv_heads or model.heads) * model.hidden // model.heads


def adapter_params(model: ModelShape, rank: int) -> int:
    """LoRA's parameters over q, k, v, o, gate, up and down of every layer: layers x r x (9h + 2kv + 3I)."""
    return model.layers * rank * (9 * model.hidden + 2 * kv_width(model) + 3 * model.intermediate)


def adapter_formula(model: ModelShape, rank: int) -> str:
    return (f"{model.layers} layers x rank {rank} x (9 x {model.hidden} + 2 x {kv_width(model)} + 3 x "
            f"{model.intermediate})")


def parse_count(text: str) -> float:
    """A parameter count: `124000000`, `1.3e9`, `350M`, `7B` (k, M, B, T)."""
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not a parameter count; write it as 1.3e9, 1.3B or 350M")
    value = float(match.group(1)) * _COUNT_SUFFIXES[match.group(2).lower()]
    if not 1 <= value <= MAX_PARAMS:
        raise ValueError(f"{text!r}: a model has at least 1 parameter and at most 1e15 (1,000T)")
    return value


def format_count(count: float) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.4g}B"
    if count >= 1e6:
        return f"{count / 1e6:.4g}M"
    return f"{count:,.0f}"


def format_gb(value: float) -> str:
    if value >= 1e9:  # an exabyte and more: the digits would not be read
        return f"{value:.3g} GB"
    return f"{value:,.2f} GB" if value >= 0.01 or value == 0 else f"{value * 1000:.3g} MB"


@dataclass(frozen=True)
class Training:
    """What one training step holds: the model, its precision and optimizer, the micro-batch on each GPU."""

    model: ModelShape
    precision: str = "bf16"
    optimizer: str = "adamw"
    batch_size: int = 8  # micro-batch per GPU
    seq_len: int = 1024  # transformer
    flash_attention: bool = False
    fine_tune: str | None = None  # None: from scratch; FULL or LORA: from a pretrained checkpoint
    lora_rank: int = DEFAULT_LORA_RANK  # LORA

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    @property
    def adapter_params(self) -> int | None:
        return adapter_params(self.model, self.lora_rank) if self.fine_tune == LORA else None


@dataclass(frozen=True)
class Sharding:
    """How the training state is spread: ZeRO stage (0: plain data parallel), CPU offload, activation checkpointing."""

    zero_stage: int = 0
    offload: str = "none"  # one of OFFLOADS
    checkpointing: bool = False

    @property
    def needs_deepspeed(self) -> bool:
        return self.zero_stage > 0 or self.offload != "none"

    def describe(self) -> str:
        parts = [f"ZeRO stage {self.zero_stage}" if self.zero_stage else "nothing sharded"]
        if self.offload != "none":
            parts.append(f"{self.offload.replace('+', ' and ')} offloaded to CPU memory")
        if self.checkpointing:
            parts.append("activation checkpointing")
        return ", ".join(parts)


@dataclass(frozen=True)
class Term:
    name: str
    formula: str
    gb: float


@dataclass(frozen=True)
class Estimate:
    gpu: tuple[Term, ...]  # per GPU
    host: tuple[Term, ...]  # offloaded, per GPU; the node's host memory holds one share per GPU

    @property
    def gpu_gb(self) -> float:
        return sum(term.gb for term in self.gpu)

    @property
    def needed_gb(self) -> float:
        return self.gpu_gb * HEADROOM

    @property
    def host_gb(self) -> float:
        return sum(term.gb for term in self.host)


def optimizer_bytes(training: Training) -> int:
    return _MOMENT_BYTES[training.optimizer] + (_MASTER_WEIGHT_BYTES if training.mixed_precision else 0)


def _optimizer_contents(training: Training) -> str:
    moments = _MOMENT_NAMES[training.optimizer]
    return f"fp32 master + {moments}" if training.mixed_precision else moments


def estimate(training: Training, sharding: Sharding, gpus: int) -> Estimate:
    """Memory on each of `gpus` data-parallel GPUs (and in host memory, per GPU, when offloading)."""
    weight_bytes = _WEIGHT_BYTES[training.precision]

    def state(name: str, count: float, bytes_per_param: int, contents: str, sharded: bool) -> Term:
        formula = f"{format_count(count)} params x {bytes_per_param} bytes ({contents})"
        share = gpus if sharded else 1
        if share > 1:
            formula += f" / {share} GPUs (ZeRO-{sharding.zero_stage})"
        return Term(name, formula, count * bytes_per_param / share / GB)

    params, stage = training.model.params, sharding.zero_stage
    adapter = training.adapter_params
    if adapter is None:
        weights = [state("weights", params, weight_bytes, training.precision, stage >= 3)]
        gradients = state("gradients", params, weight_bytes, training.precision, stage >= 2)
        optimizer = state("optimizer", params, optimizer_bytes(training), _optimizer_contents(training), stage >= 1)
    else:
        weights = [state("frozen base", params, weight_bytes, f"{training.precision}, frozen", stage >= 3),
                   state("adapter weights", adapter, _ADAPTER_BYTES, "fp32", stage >= 3)]
        gradients = state("adapter gradients", adapter, _ADAPTER_BYTES, "fp32", stage >= 2)
        optimizer = state("adapter optimizer", adapter, _MOMENT_BYTES[training.optimizer],
                          _MOMENT_NAMES[training.optimizer], stage >= 1)
    on_gpu, on_host = [gradients], []
    (on_host if sharding.offload != "none" else on_gpu).append(optimizer)
    (on_host if sharding.offload == "optimizer+weights" else on_gpu)[:0] = weights
    on_gpu += _activations(training, sharding.checkpointing)
    return Estimate(tuple(on_gpu), tuple(on_host))


def _activations(training: Training, checkpointing: bool) -> list[Term]:
    model = training.model
    scale = 2 if training.precision == "fp32" else 1
    in_fp32 = " x 2 (fp32)" if scale == 2 else ""
    b = training.batch_size
    if model.kind == MLP:
        values = model.features + 2 * model.layers * model.hidden
        value_bytes = _WEIGHT_BYTES[training.precision]
        formula = f"{b} samples x ({model.features} + 2 x {model.layers} x {model.hidden}) x {value_bytes} bytes"
        return [Term("activations", formula, b * values * value_bytes / GB)]
    s, h, a, layers = training.seq_len, model.hidden, model.heads, model.layers
    per_value = 34 if training.flash_attention else 34 + 5 * a * s / h
    per_value_text = "34" if training.flash_attention else f"(34 + 5 x {a} x {s} / {h})"
    one_layer = s * b * h * per_value * scale
    one_layer_text = f"{s}*{b}*{h} x {per_value_text} bytes{in_fp32}"
    if checkpointing:
        inputs = layers * 2 * s * b * h * scale
        formula = (f"{layers} layers x 2 x {s}*{b}*{h} bytes{in_fp32} (layer inputs) + {one_layer_text} "
                   "(one layer rebuilt)")
        terms = [Term("activations", formula, (inputs + one_layer) / GB)]
    else:
        terms = [Term("activations", f"{layers} layers x {one_layer_text}", layers * one_layer / GB)]
    if model.vocab:
        formula = f"{s}*{b}*{model.vocab} x {_LOGIT_BYTES} bytes (fp32 loss)"
        terms.append(Term("logits", formula, s * b * model.vocab * _LOGIT_BYTES / GB))
    return terms


def fully_sharded(training: Training, checkpointing: bool, gpus: int) -> Estimate:
    """Memory on each of `gpus` GPUs under FSDP2: the fp32 weights, gradients and optimizer states sharded over them
    (under LoRA: the frozen base as loaded and the fp32 adapter's)."""
    per_param = 2 * _ADAPTER_BYTES + _MOMENT_BYTES[training.optimizer]
    contents = f"fp32 weights, fp32 gradients, {_MOMENT_NAMES[training.optimizer]}"
    params, adapter = training.model.params, training.adapter_params

    def sharded(name: str, count: float, bytes_per_param: int, contents: str) -> Term:
        formula = f"{format_count(count)} params x {bytes_per_param} bytes ({contents}) / {gpus} GPUs (FSDP2)"
        return Term(name, formula, count * bytes_per_param / gpus / GB)

    if adapter is None:
        states = [sharded("sharded state", params, per_param, contents)]
    else:
        states = [sharded("frozen base", params, _WEIGHT_BYTES[training.precision], f"{training.precision}, frozen"),
                  sharded("adapter state", adapter, per_param, contents)]
    return Estimate((*states, *_activations(training, checkpointing)), ())
