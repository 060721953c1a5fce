"""The `advise` command: its options, the job they describe, and the advice printed as text, JSON or answers."""

from __future__ import annotations

import argparse
import json
import sys

from ...compute.catalog import CLOUDS
from ...config import bounded
from .memory import (DEFAULT_LORA_RANK, FINE_TUNES, LORA, MLP, NAMED_MODELS, OPTIMIZERS, PRECISIONS, TRANSFORMER,
                     ModelShape, Training, mlp_params, parse_count)
from .plan import CLASSICAL, MAX_DATASET_GB, AdviseError, Job
from .report import render
from .search import advise

MODEL_TYPES = (TRANSFORMER, MLP, CLASSICAL)
MAX_SIZE = 10**9  # layers, widths, batch, sequence length: beyond this the arithmetic describes no real model


positive_size = bounded(int, 1, MAX_SIZE, unreadable="{text!r} is not a whole number",
                        too_low="{text!r} must be 1 or more", too_high="{text!r} must be at most {high:,}")
dataset_size = bounded(float, 0, MAX_DATASET_GB, low_open=True, unreadable="{text!r} is not a size in GB",
                       not_finite="{text!r} is not a finite size in GB",
                       too_low="{text!r} must be above 0 (the dataset's size on disk, in GB)",
                       too_high="{text!r} must be at most {high:,.0f} GB (an exabyte)")


def _count(text: str) -> float:
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", type=str.lower, choices=sorted(NAMED_MODELS),
                       help="a well-known transformer by name (any case: Llama-3.1-8B)")
    model.add_argument("--params", type=_count, help="parameter count: 1.3e9, 1.3B, 350M")
    model.add_argument("--model-type", choices=MODEL_TYPES, default=TRANSFORMER,
                       help="transformer (default); mlp on tabular features; classical: Spark ML on CPU nodes")
    model.add_argument("--layers", type=positive_size, help="transformer layers, or MLP hidden layers")
    model.add_argument("--hidden", type=positive_size, help="hidden size (MLP: width of each hidden layer)")
    model.add_argument("--heads", type=positive_size, help="attention heads (transformer)")
    model.add_argument("--kv-heads", type=positive_size,
                       help="key/value heads under grouped-query attention (default: as many as --heads)")
    model.add_argument("--intermediate", type=positive_size,
                       help="the gated MLP's width of a Llama-shaped transformer (needed by --fine-tune lora)")
    model.add_argument("--vocab", type=positive_size, help="vocabulary size; counts the output logits")
    model.add_argument("--features", type=positive_size, help="input features (mlp)")
    training = parser.add_argument_group("training")
    training.add_argument("--precision", choices=PRECISIONS, default="bf16", help="bf16 or fp16 (mixed), or fp32")
    training.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    training.add_argument("--batch-size", type=positive_size, default=8, help="micro-batch per GPU (default 8)")
    training.add_argument("--seq-len", type=positive_size, default=1024, help="sequence length (default 1024)")
    training.add_argument("--flash-attention", action="store_true",
                          help="fused attention (FlashAttention, PyTorch SDPA): attention scores are not stored")
    training.add_argument("--activation-checkpointing", action="store_true",
                          help="the model always checkpoints its activations (otherwise advised only when needed)")
    training.add_argument("--fine-tune", choices=FINE_TUNES,
                          help="fine-tune a pretrained transformer: every weight (full), or LoRA adapters on its "
                          "attention and MLP projections beside the frozen base (lora); absent: from scratch")
    training.add_argument("--lora-rank", type=positive_size,
                          help=f"the adapters' rank r (default {DEFAULT_LORA_RANK}; --fine-tune lora)")
    where = parser.add_argument_group("data and compute")
    where.add_argument("--dataset-gb", type=dataset_size, default=0.0, help="dataset size on disk, GB")
    where.add_argument("--cloud", choices=CLOUDS, required=True)
    where.add_argument("--node-type", help="consider only this node type (from the catalog)")
    where.add_argument("--prefer-ray", action="store_true", help="use Ray Train when no DeepSpeed sharding is needed")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--template-answers", action="store_true",
                        help="print only the cookiecutter answers (key=value ...) for the recommendation")


def job_from_args(args: argparse.Namespace) -> Job:
    if args.lora_rank is not None and args.fine_tune != LORA:
        raise AdviseError(f"--lora-rank {args.lora_rank} sizes LoRA's adapters: add --fine-tune lora or drop it")
    if args.model_type == CLASSICAL:
        given = [flag for flag, value in (("--model", args.model), ("--params", args.params),
                                          ("--fine-tune", args.fine_tune)) if value is not None]
        if given:
            raise AdviseError(f"{', '.join(given)} describe a neural network; a classical model needs only "
                              "--dataset-gb")
        training = None
    else:
        options = dict(precision=args.precision, optimizer=args.optimizer, batch_size=args.batch_size,
                       seq_len=args.seq_len, flash_attention=args.flash_attention, fine_tune=args.fine_tune,
                       lora_rank=args.lora_rank or DEFAULT_LORA_RANK)
        training = Training(_model_from_args(args), **options)
    return Job(cloud=args.cloud, training=training, dataset_gb=args.dataset_gb, node_type_id=args.node_type,
               prefer_ray=args.prefer_ray, activation_checkpointing=args.activation_checkpointing)


def _model_from_args(args: argparse.Namespace) -> ModelShape:
    shape_flags = {"--layers": args.layers, "--hidden": args.hidden, "--heads": args.heads,
                   "--kv-heads": args.kv_heads, "--intermediate": args.intermediate, "--vocab": args.vocab,
                   "--features": args.features}
    if args.model is not None:
        given = [flag for flag, value in {**shape_flags, "--params": args.params}.items() if value is not None]
        if args.model_type != TRANSFORMER:
            raise AdviseError(f"--model {args.model} is a transformer; drop --model-type {args.model_type}")
        if given:
            raise AdviseError(f"--model {args.model} fixes the shape; drop {', '.join(given)} "
                              "(or describe the model with --params and the shape flags alone)")
        return NAMED_MODELS[args.model]
    if args.model_type == TRANSFORMER:
        missing = [flag for flag in ("--params", "--layers", "--hidden", "--heads")
                   if {"--params": args.params, **shape_flags}[flag] is None]
        if missing:
            raise AdviseError(f"a transformer needs --model NAME ({', '.join(sorted(NAMED_MODELS))}) or --params "
                              f"with --layers, --hidden and --heads; missing {', '.join(missing)}")
        if args.features is not None:
            raise AdviseError("--features describes an MLP's input; a transformer's is --seq-len")
        if args.kv_heads is not None and args.heads % args.kv_heads:
            raise AdviseError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}: each key/value head "
                              "serves a whole group of query heads")
        if args.kv_heads is not None and args.hidden % args.heads:
            raise AdviseError(f"--heads {args.heads} must divide --hidden {args.hidden} to give the key/value heads "
                              "a whole head size")
        return ModelShape(args.params, TRANSFORMER, args.layers, args.hidden, args.heads, vocab=args.vocab,
                          kv_heads=args.kv_heads, intermediate=args.intermediate)
    missing = [flag for flag in ("--features", "--layers", "--hidden") if shape_flags[flag] is None]
    if missing:
        raise AdviseError(f"an MLP needs --features, --layers and --hidden; missing {', '.join(missing)}")
    transformer_flags = {"--heads": args.heads, "--kv-heads": args.kv_heads, "--intermediate": args.intermediate,
                         "--vocab": args.vocab, "--activation-checkpointing": args.activation_checkpointing or None,
                         "--fine-tune": args.fine_tune}
    given = [flag for flag, value in transformer_flags.items() if value is not None]
    if given:
        raise AdviseError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} transformers; drop "
                          f"{'it' if len(given) == 1 else 'them'} for --model-type mlp")
    params = args.params if args.params is not None else mlp_params(args.features, args.hidden, args.layers)
    return ModelShape(params, MLP, args.layers, args.hidden, features=args.features)


def run(args: argparse.Namespace) -> int:
    try:
        advice = advise(job_from_args(args))
    except AdviseError as error:
        print(f"advise: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(advice.to_dict(), indent=2))
    elif args.template_answers:
        if advice.plan is None:
            print(f"advise: does not fit: {advice.why}", file=sys.stderr)
            return 1
        print(" ".join(f"{key}={value}" for key, value in advice.template_answers().items()))
    else:
        print(render(advice), end="")
    return 0 if advice.plan is not None else 1
