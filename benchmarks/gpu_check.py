"""The GPU check: the causal-LM task at GPT-2 small's shape, trained by the project's loop under torchrun on every
GPU of this machine, in bf16, by DDP, FSDP2 and DeepSpeed ZeRO-2, each without and with --compile: their tokens per
second and MFU against the GPU's dense peak, and where DDP's step's time goes. Then the fine-tuning task on a model of
Llama 3.2 1B's shape (random weights, nothing downloaded), with LoRA and in full, under FSDP2. `bash
benchmarks/gpu_check.sh` runs it.

    python -m benchmarks.gpu_check [--dry-run] [--out DIR] [--batch-size B] [--steps S] [--epochs E] [--only RUN...]

The data is synthetic text (random token ids for the fine-tuning) staged with pyarrow in the shape Spark stages it (no
Spark on the GPU machine); the run is what `python -m distributed_training.engines.torchrun --config FILE` does on a
serverless GPU node. Without a GPU it prints its plan and writes nothing (a dry run); `--cpu-processes N` runs it on
CPU processes instead (tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from distributed_training.training.throughput import PEAKS, Peak, mfu, peak_of

FORMULA = ("MFU = tokens/s x (6 x N + 12 x n_layer x d_model x seq_len) / (n_gpus x peak FLOP/s), "
           "N = parameters in matrix multiplies (position embedding left out): causal_lm.flops_per_token and "
           "throughput.mfu, as the loop reports it in MLflow")

TASK = "distributed_training.tasks.causal_lm"
FINE_TUNE_TASK = "distributed_training.tasks.fine_tune"
MFU_TARGET = 0.45  # GPT-2 small through the loop on one H200 (issue 16)
LEARNING_RATE = 6e-4  # GPT-2 small's; the loop's default suits the tiny model
BREAKDOWN_STEPS = 30
# Guesses, for the dry run's estimate only: a launch's imports, process group, data, model and final checkpoint; and
# what --compile adds to a run (inductor compiles the training step, a short last batch's and the evaluation's).
STARTUP_SECONDS_PER_LAUNCH = 45
COMPILE_SECONDS_PER_RUN = 60
FINE_TUNE_SECONDS_PER_RUN = 60  # loading 5 GB of weights twice (the run, and its final model), the last checkpoint
ASSUMED_MFU = 0.35  # for the estimate of the training time only
TEST_DOCUMENTS_PER_PROCESS = 200
# The fine-tuning runs' model: a LlamaConfig of Llama 3.2 1B's shape (its config.json on the Hub: 16 layers, width
# 2048, 32 heads, 8 of keys and values, MLP 8192, a 128,256-token vocabulary, tied embeddings, llama3 RoPE), random
# weights; "tiny" is the same kind of model for the CPU test, its vocabulary still above uint16's 32,768 ids.
FINE_TUNE_SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128_256, tie_word_embeddings=True,
                         rms_norm_eps=1e-5, max_position_embeddings=131_072, bos_token_id=128_000,
                         eos_token_id=128_001, rope_parameters={
                             "rope_type": "llama3", "rope_theta": 500_000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=40_000, tie_word_embeddings=True, max_position_embeddings=1024),
}
FINE_TUNE_LEARNING_RATE = 2e-5  # full fine-tuning's usual; LoRA's adapters take 10 times as much
# Held-out blocks a process: few, because the loop evaluates up to 256 sequences at once, and their logits over a
# 128,256-token vocabulary (in float32 for the loss) would not fit a GPU at 1,024 tokens a sequence (134 GB).
FINE_TUNE_HELD_OUT_BLOCKS = 4
FINE_TUNE_MODEL, FINE_TUNE_STAGING = "fine-tune-model", "fine-tune-staging"  # in --out


@dataclasses.dataclass(frozen=True)
class Machine:
    processes: int
    device_name: str  # "cpu" with --cpu-processes
    peak: Peak | None
    precision: str

    @property
    def on_gpu(self) -> bool:
        return self.device_name != "cpu"


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the comparison: a strategy, compiled or not."""

    name: str  # its folder, and its key in result.json
    label: str
    engine: str
    parallelism: str | None  # --parallelism (FSDP2), where the strategy is not the engine's default
    compiled: bool
    lora_rank: int | None = None  # a fine-tuning run of the Llama-shaped model (0: in full); None: causal_lm

    @property
    def fine_tunes(self) -> bool:
        return self.lora_rank is not None


RUNS = tuple(Run(name + "-compiled" * compiled, label + " + torch.compile" * compiled, engine, parallelism, compiled)
             for name, label, engine, parallelism in (("ddp", "DDP", "torch_distributor", None),
                                                      ("zero2", "DeepSpeed ZeRO-2", "deepspeed", None),
                                                      ("fsdp2", "FSDP2", "torch_distributor", "fsdp2"))
             for compiled in (False, True)) + (
    Run("llama-1b-lora", "fine-tuning with LoRA, FSDP2", "torch_distributor", "fsdp2", False, lora_rank=16),
    Run("llama-1b-full", "fine-tuning in full, FSDP2", "torch_distributor", "fsdp2", False, lora_rank=0))


@dataclasses.dataclass(frozen=True)
class Model:
    size: str
    layers: int
    heads: int
    width: int
    context: int
    parameters: int
    matmul_parameters: int  # without the position embedding
    flops_per_token: int  # the task's own count, the loop's


@dataclasses.dataclass(frozen=True)
class FineTuneModel:
    shape: str
    layers: int
    width: int
    vocabulary: int
    context: int  # --max-length
    parameters: int
    trained_parameters: dict  # by run name: every parameter, or LoRA's adapters
    flops_per_token: dict  # by run name: the task's own count, the loop's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run and write nothing")
    parser.add_argument("--out", default=os.path.join("build", "gpu-check"), help="results (default build/gpu-check)")
    parser.add_argument("--model-size", default="gpt2-small", help="the causal_lm preset (default gpt2-small)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per GPU per step (default 32)")
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch (default 30)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs; the first is warm-up (default 2)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense peak, where the lookup has none")
    parser.add_argument("--time-limit", type=float, default=450, help="seconds for everything (default 450)")
    parser.add_argument("--gpus", type=int, help="plan for this many GPUs (a dry run)")
    parser.add_argument("--device-name", help="plan for this GPU, as nvidia-smi names it (a dry run)")
    parser.add_argument("--cpu-processes", type=int, help="run on this many CPU processes instead (tests)")
    parser.add_argument("--fine-tune-shape", choices=list(FINE_TUNE_SHAPES), default="llama-3.2-1b",
                        help="the fine-tuning runs' model (default llama-3.2-1b)")
    parser.add_argument("--fine-tune-batch-size", type=int, default=8,
                        help="the fine-tuning runs' sequences per GPU per step (default 8)")
    parser.add_argument("--fine-tune-length", type=int, default=1024,
                        help="the fine-tuning runs' tokens a sequence, --max-length (default 1024)")
    parser.add_argument("--only", nargs="+", choices=[run.name for run in RUNS], help="these runs alone (default all; "
                        "DDP's breakdown of a step comes with ddp)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.time_limit

    import torch

    gpus_visible = torch.cuda.is_available() and not args.cpu_processes
    dry_run = args.dry_run or args.gpus is not None or args.device_name is not None
    if not (gpus_visible or args.cpu_processes or dry_run):
        print("no GPU visible (torch.cuda.is_available() is false): dry run")
        dry_run = True
    machine = Machine(args.cpu_processes, "cpu", None, "fp32") if args.cpu_processes else _gpus(args, gpus_visible)
    model = _model(args.model_size)
    fine_tunes = any(run.fine_tunes and not _unavailable(run, machine) for run in _runs(args))
    fine_tune_model = _fine_tune_model(args) if fine_tunes else None
    _print_plan(args, machine, model, fine_tune_model)
    if dry_run:
        print("dry run: nothing was run or written")
        return 0
    return _check(args, machine, model, fine_tune_model, deadline)


# ------------------------------------------------------------------ the machine, the model, the plan

def _gpus(args, visible: bool) -> Machine:
    """This machine's GPUs, or the ones --gpus and --device-name plan for."""
    import torch

    names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())] if visible else []
    if len(set(names)) > 1:
        print(f"warning: the GPUs differ ({', '.join(sorted(set(names)))}): the peak is the first one's")
    name = args.device_name or (names[0] if names else "unknown GPU")
    peak = peak_of(name)
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False) if visible else True  # not emulated: slow
    return Machine(args.gpus or len(names) or 1, name, peak, peak.precision if peak else "bf16" if bf16 else "fp16")


def _model(size: str) -> Model:
    import torch

    from distributed_training.tasks.causal_lm import GPT, PRESETS, Options, flops_per_token

    layers, heads, width, context = PRESETS[size]
    with torch.device("meta"):  # counted without allocating
        gpt = GPT(layers, heads, width, context)
    parameters = sum(parameter.numel() for parameter in gpt.parameters())
    return Model(size, layers, heads, width, context, parameters, parameters - gpt.position_embedding.weight.numel(),
                 flops_per_token(gpt, Options(model_size=size)))


def _fine_tune_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(**FINE_TUNE_SHAPES[args.fine_tune_shape])


def _fine_tune_options(args, run: Run, base_model: str = ""):
    from distributed_training.tasks.fine_tune import Options

    return Options(base_model=base_model, max_length=args.fine_tune_length, lora_rank=run.lora_rank)


def _fine_tune_model(args) -> FineTuneModel:
    """The fine-tuning model's size and FLOPs, counted on the meta device as the task builds it (with its adapters)."""
    import torch
    from transformers import AutoModelForCausalLM

    from distributed_training.tasks.fine_tune import flops_per_token, with_adapters

    config, trained, flops = _fine_tune_config(args), {}, {}
    for run in (run for run in RUNS if run.fine_tunes):
        options = _fine_tune_options(args, run)
        with torch.device("meta"):
            model = with_adapters(AutoModelForCausalLM.from_config(config), options)
        trained[run.name] = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
        flops[run.name] = flops_per_token(model, options)
    in_full = next(run.name for run in RUNS if run.lora_rank == 0)  # trains every parameter
    return FineTuneModel(args.fine_tune_shape, config.num_hidden_layers, config.hidden_size, config.vocab_size,
                         args.fine_tune_length, trained[in_full], trained, flops)


def _peak_tflops(args, machine: Machine) -> float | None:
    return args.peak_tflops or (machine.peak.tflops if machine.peak else None)


def _print_plan(args, machine: Machine, model: Model, fine_tune_model: FineTuneModel | None) -> None:
    tokens_per_step = args.batch_size * model.context * machine.processes
    print("== plan ==")
    what = f"{machine.processes} x {machine.device_name}" if machine.on_gpu else f"{machine.processes} CPU process(es)"
    print(f"machine: {what}, {machine.precision}")
    print(f"model: causal_lm --model-size {model.size}: {model.layers} layers, {model.heads} heads, width "
          f"{model.width}, context {model.context}; {model.parameters:,} parameters, {model.matmul_parameters:,} in "
          "matrix multiplies (GPT-2 small's 124M include 38.6M of embedding for its 50,257-token vocabulary; this "
          "model reads bytes, 257 tokens)")
    print(f"FLOPs: {FORMULA}")
    print(f"  = {model.flops_per_token / 1e6:,.1f} MFLOP per token, "
          f"{model.flops_per_token * tokens_per_step / 1e12:,.2f} TFLOP per step of {tokens_per_step:,} tokens "
          f"({args.batch_size} sequences x {model.context} tokens x {machine.processes} process(es))")
    if fine_tune_model:
        _print_fine_tune_plan(args, machine, fine_tune_model)
    peak = _peak_tflops(args, machine)
    if not machine.on_gpu:
        print("peak: none on CPU: MFU is not computed")
    elif args.peak_tflops:
        print(f"peak: {args.peak_tflops:,.1f} TFLOP/s a GPU, as given (--peak-tflops)")
    elif machine.peak and peak:
        print(f"peak: {machine.device_name!r} is the {machine.peak.model}: {peak:,.1f} TFLOP/s dense "
              f"{machine.peak.precision} a GPU ({machine.peak.source})")
    else:
        reason = machine.peak.source if machine.peak else "not in the table of known GPUs"
        print(f"peak: unknown for {machine.device_name!r} ({reason}): MFU will not be computed; set PEAK_TFLOPS. "
              f"Known: {', '.join(sorted({known.model for known in PEAKS.values()}))}")
    print(f"data: synthetic TPC-H comments (fine-tuning: random token ids), {args.steps} steps an epoch, "
          f"{args.epochs} epochs (the first is warm-up and left out of the figures)")
    runs = _runs(args)
    print("runs, in this order (each the loop under torchrun, from the config.json written for it):")
    for run in runs:
        options = [f"--engine {run.engine}", f"--parallelism {run.parallelism}" if run.parallelism else "",
                   "--compile" if run.compiled else ""]
        skipped = _unavailable(run, machine)
        print(f"  {run.name}: {run.label} ({' '.join(filter(None, options))})" + (f": {skipped}" if skipped else ""))
    print("commands:")
    for command in _commands(args, machine):
        print("  + " + " ".join(command))
    if machine.processes < 2:
        print("  (one process: DDP and ZeRO-2 communicate nothing, no gradients to average and no shards to gather, "
              "so they differ here by their own overhead alone; communication, and FSDP2, need 2 GPUs or more; the "
              "fine-tuning runs train the model as it is, as --parallelism fsdp2 does on one process)")
    done = [run for run in runs if not _unavailable(run, machine)]
    launches, compiled = len(_commands(args, machine)), sum(run.compiled for run in done)
    if peak:
        training = sum(args.epochs * args.steps * _flops_per_token(run, model, fine_tune_model)
                       * _tokens_per_step(args, run, model, machine) for run in done) / (
            machine.processes * peak * 1e12 * ASSUMED_MFU)
        seconds = (launches * STARTUP_SECONDS_PER_LAUNCH + compiled * COMPILE_SECONDS_PER_RUN + training
                   + FINE_TUNE_SECONDS_PER_RUN * sum(run.fine_tunes for run in done))
        print(f"expected: about {seconds / 60:.1f} min ({launches} launches x ~{STARTUP_SECONDS_PER_LAUNCH} s of "
              f"start-up and checkpoint, {compiled} compiled runs x ~{COMPILE_SECONDS_PER_RUN} s of compiling, "
              f"~{FINE_TUNE_SECONDS_PER_RUN} s more a fine-tuning run for its model's weights and checkpoint, plus "
              f"{training:.0f} s of training at an assumed {ASSUMED_MFU:.0%} MFU); stops at {args.time_limit:.0f} s"
              f"{', skipping the runs left then' if seconds > args.time_limit else ''}")
    else:
        print(f"expected: no estimate without a peak; stops at {args.time_limit:.0f} s")


def _print_fine_tune_plan(args, machine: Machine, model: FineTuneModel) -> None:
    tokens_per_step = args.fine_tune_batch_size * model.context * machine.processes
    print(f"fine-tuning model: fine_tune on a LlamaConfig of {model.shape}'s shape (random weights): {model.layers} "
          f"layers, width {model.width}, vocabulary {model.vocabulary:,}, --max-length {model.context}; "
          f"{model.parameters:,} parameters (the embedding tied to the output layer)")
    print("  FLOPs: fine_tune.flops_per_token: 6 per trained weight, 4 per frozen one (no weight gradient), the "
          "embedding counted as the output layer it is, plus 12 x layers x width x context")
    for name, flops in model.flops_per_token.items():
        print(f"  {name}: {model.trained_parameters[name]:,} trained parameters, {flops / 1e9:,.2f} GFLOP per token, "
              f"{flops * tokens_per_step / 1e12:,.1f} TFLOP per step of {tokens_per_step:,} tokens "
              f"({args.fine_tune_batch_size} sequences x {model.context} tokens x {machine.processes} process(es))")


def _flops_per_token(run: Run, model: Model, fine_tune_model: FineTuneModel | None) -> int:
    return fine_tune_model.flops_per_token[run.name] if run.fine_tunes else model.flops_per_token


def _tokens_per_step(args, run: Run, model: Model, machine: Machine) -> int:
    if run.fine_tunes:
        return args.fine_tune_batch_size * args.fine_tune_length * machine.processes
    return args.batch_size * model.context * machine.processes


def _runs(args) -> list[Run]:
    return [run for run in RUNS if not args.only or run.name in args.only]


def _unavailable(run: Run, machine: Machine) -> str | None:
    """Why the run is not done on this machine, or None."""
    if run.parallelism and machine.processes < 2 and not run.fine_tunes:
        return "skipped: one process trains the model as it is under --parallelism fsdp2, as the DDP run does"
    if run.engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "skipped: deepspeed is not importable here"
    if run.fine_tunes and not all(importlib.util.find_spec(name) for name in ("transformers", "peft")):
        return "skipped: the fine-tuning task needs transformers and peft, not importable here"
    return None


def _commands(args, machine: Machine) -> list[list[str]]:
    """The causal_lm runs' launches, the breakdown of a DDP step (after them: the comparison comes first), then the
    fine-tuning runs'."""
    out = Path(args.out)
    runs = [run for run in _runs(args) if not _unavailable(run, machine)]
    commands = [_loop_command(out / run.name) for run in runs if not run.fine_tunes]
    if any(run.name == "ddp" for run in runs):
        commands.append(_breakdown_command(out / "ddp", machine))
    return commands + [_loop_command(out / run.name) for run in runs if run.fine_tunes]


def _loop_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "distributed_training.engines.torchrun", "--config", str(run_dir / "config.json")]


def _breakdown_command(run_dir: Path, machine: Machine) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(machine.processes),
            "-m", "benchmarks.gpu_breakdown", "--config", str(run_dir / "config.json"), "--steps",
            str(BREAKDOWN_STEPS), "--output", str(run_dir / "breakdown.json")]


# ------------------------------------------------------------------ the check itself

def _check(args, machine: Machine, model: Model, fine_tune_model: FineTuneModel | None, deadline: float) -> int:
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in (
            "staging", FINE_TUNE_STAGING, "result.json")):
        print(f"error: {out} is not a GPU check's folder and not empty: give a new or empty --out (OUT)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for previous in out.iterdir():  # the previous check's results (the folder itself may be a mount point)
        if previous.is_dir() and not previous.is_symlink():
            shutil.rmtree(previous)
        else:
            previous.unlink()
    result = {"device": machine.device_name, "processes": machine.processes, "precision": machine.precision,
              "model": dataclasses.asdict(model), "flops_per_token": model.flops_per_token, "formula": FORMULA,
              "peak_tflops": _peak_tflops(args, machine), "peak_source": machine.peak.source if machine.peak else None,
              "mfu_target": MFU_TARGET,
              "fine_tune_model": dataclasses.asdict(fine_tune_model) if fine_tune_model else None}
    runs = [run for run in _runs(args) if not _unavailable(run, machine)]
    result.update({run.name: _unavailable(run, machine) for run in _runs(args) if _unavailable(run, machine)})
    if any(not run.fine_tunes for run in runs):
        print("== staging synthetic text (pyarrow, no Spark) ==", flush=True)
        _stage(out / "staging", args, machine, model)
    if any(run.fine_tunes for run in runs):
        print(f"== the fine-tuning model ({args.fine_tune_shape}'s shape, random weights) and its data ==", flush=True)
        _save_fine_tune_model(out / FINE_TUNE_MODEL, args, machine)
        _stage_fine_tune(out / FINE_TUNE_STAGING, args, machine, fine_tune_model)
    for run in runs:
        if run.fine_tunes:
            _write_fine_tune_config(out / run.name, run, args, machine, out)
        else:
            _write_config(out / run.name, run, args, machine, out / "staging")
    failed = False

    def loop_runs(chosen: list[Run]) -> None:
        nonlocal failed
        for run in chosen:
            try:
                result[run.name] = _loop_run(out / run.name, run, args, machine,
                                             _tokens_per_step(args, run, model, machine),
                                             _flops_per_token(run, model, fine_tune_model), deadline)
            except subprocess.CalledProcessError as error:  # the other runs still have something to say
                result[run.name], failed = f"failed: {error}", True
            _write(out, result)

    try:
        loop_runs([run for run in runs if not run.fine_tunes])
        if isinstance(result.get("ddp"), dict):
            _run("where the time goes", _breakdown_command(out / "ddp", machine), deadline)
            result["breakdown"] = json.loads((out / "ddp" / "breakdown.json").read_text())
            _print_breakdown(result)
        loop_runs([run for run in runs if run.fine_tunes])
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as error:
        result["error"], failed = str(error), True
        print(f"error: {error}", file=sys.stderr)
    _print_comparison(result, _runs(args))
    _write(out, result)
    return 1 if failed else 0


def _stage(directory: Path, args, machine: Machine, model: Model) -> None:
    """Enough documents that every process has its steps' sequences (and a tenth more), and a small held-out
    split. A pool of distinct comments is repeated: what they say does not change the throughput."""
    from .synthetic import documents, stage_text

    pool = documents(20_000)
    average_tokens = sum(len(text) + 1 for text in pool) / len(pool)
    train_tokens = args.steps * args.batch_size * (model.context + 1) * machine.processes * 1.1
    train = [pool[index % len(pool)] for index in range(math.ceil(train_tokens / average_tokens))]
    test = documents(TEST_DOCUMENTS_PER_PROCESS * machine.processes, seed=1)
    staged = stage_text(str(directory), train, test, files=machine.processes)
    print(f"staged {staged.train_rows:,} training and {staged.test_rows:,} held-out documents in {directory}")


def _save_fine_tune_model(directory: Path, args, machine: Machine) -> None:
    """A random-weight model of the shape, saved with save_pretrained as a base model is (bf16: half the bytes; the
    task loads it in float32, as it does any base model), built on the GPU where there is one (faster)."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    torch.manual_seed(0)
    with torch.device("cuda" if machine.on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(_fine_tune_config(args), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    del model
    print(f"saved a {args.fine_tune_shape} model in {directory} in {time.monotonic() - started:.0f} s", flush=True)


def _stage_fine_tune(directory: Path, args, machine: Machine, model: FineTuneModel) -> None:
    """Random token ids, as the task stages them (uint32 past 32,768 ids): exactly the steps' blocks of
    --max-length + 1 a process, and FINE_TUNE_HELD_OUT_BLOCKS held-out ones. The ids do not change the throughput."""
    import numpy as np

    from distributed_training.tasks.fine_tune import staged_dtype

    from .synthetic import stage_tokens

    rng, block, dtype = np.random.default_rng(0), args.fine_tune_length + 1, np.dtype(staged_dtype(model.vocabulary))
    lengths = {"train": args.steps * args.fine_tune_batch_size * block, "test": FINE_TUNE_HELD_OUT_BLOCKS * block}
    streams = {split: [rng.integers(0, model.vocabulary, length, dtype=dtype) for _ in range(machine.processes)]
               for split, length in lengths.items()}
    counts = sum(np.bincount(ids, minlength=model.vocabulary) for ids in streams["train"])
    stats = {"token_counts": counts.tolist(), "tokens": int(counts.sum()), "vocabulary": model.vocabulary}
    blocks = {split: length // block * machine.processes for split, length in lengths.items()}
    stage_tokens(str(directory), FINE_TUNE_TASK, streams, (blocks["train"], blocks["test"]), stats)
    print(f"staged {blocks['train']:,} training and {blocks['test']:,} held-out blocks of {block:,} {dtype} ids in "
          f"{directory}")


def _write_fine_tune_config(run_dir: Path, run: Run, args, machine: Machine, out: Path) -> None:
    _write_run_config(run_dir, out / FINE_TUNE_STAGING, _common_config(run, args, machine, run_dir),
                      task=FINE_TUNE_TASK, batch_size=args.fine_tune_batch_size,
                      learning_rate=FINE_TUNE_LEARNING_RATE * (10 if run.lora_rank else 1),
                      task_options=_fine_tune_options(args, run, str((out / FINE_TUNE_MODEL).resolve())))


def _common_config(run: Run, args, machine: Machine, run_dir: Path) -> dict:
    return dict(engine=run.engine, local=not machine.on_gpu, table="synthetic", output_dir=str(run_dir),
                gpus_per_node=machine.processes if machine.on_gpu else 0,
                processes=None if machine.on_gpu else machine.processes, precision=machine.precision,
                epochs=args.epochs,
                # Figures settled at the epochs' ends alone: the run's leave the first epoch out, and with it the
                # compiling (the epoch's short last batch is compiled again, for a dynamic batch size).
                log_every_steps=0, checkpoint_every=args.epochs, keep_checkpoints=1, resume=False, tracking=False,
                compile=run.compiled, zero_stage=2 if run.engine == "deepspeed" else None,
                **({"parallelism": run.parallelism} if run.parallelism else {}))


def _write_run_config(run_dir: Path, staging: Path, common: dict, **specific) -> None:
    from distributed_training.config import Config, to_json

    run_dir.mkdir(parents=True)
    (run_dir / "staging").symlink_to(staging.resolve())  # the loop reads OUTPUT_DIR/staging
    (run_dir / "config.json").write_text(json.dumps(to_json(Config(**common, **specific)), indent=2))


def _write_config(run_dir: Path, run: Run, args, machine: Machine, staging: Path) -> None:
    from distributed_training.tasks.causal_lm import Options

    _write_run_config(run_dir, staging, _common_config(run, args, machine, run_dir), task=TASK,
                      batch_size=args.batch_size, learning_rate=LEARNING_RATE,
                      task_options=Options(model_size=args.model_size))


def _loop_run(run_dir: Path, run: Run, args, machine: Machine, tokens_per_step: int, flops_per_token: int,
              deadline: float) -> dict:
    label = run.label
    _run(label, _loop_command(run_dir), deadline)
    # The final weights and optimizer state (1 GB for GPT-2 small, 15 GB for a 1B model in full), of no use here
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "model.pt").unlink()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    tokens_per_second = metrics["tokens_per_second"]  # the loop's figure, as MLflow has it
    peak = _peak_tflops(args, machine)
    figures = {"label": label, "tokens_per_second": tokens_per_second,
               "tokens_per_second_per_process": tokens_per_second / machine.processes,
               "step_seconds": tokens_per_step / tokens_per_second,
               "achieved_tflops_per_process": tokens_per_second * flops_per_token / machine.processes / 1e12,
               "mfu": mfu(tokens_per_second, flops_per_token, machine.processes, peak) if peak else None,
               "epoch_seconds": [epoch["train_seconds"] for epoch in metrics["epochs"]],
               "train_examples": metrics["train_examples"], "final_train_loss": metrics["final"]["train_loss"],
               **({"sharded_by_fsdp2": machine.processes > 1} if run.parallelism == "fsdp2" else {})}
    utilisation = f"MFU {figures['mfu']:.1%}" if figures["mfu"] is not None else "MFU unknown (no peak)"
    print(f"{label}: {tokens_per_second:,.0f} tokens/s over {machine.processes} process(es) after the first epoch, "
          f"{figures['achieved_tflops_per_process']:,.1f} TFLOP/s a process, {utilisation}; a step takes "
          f"{figures['step_seconds'] * 1000:.1f} ms", flush=True)
    return figures


def _print_comparison(result: dict, runs: list[Run]) -> None:
    """Every run's tokens/s and MFU (the epochs after the first), and its tokens/s over eager DDP's."""
    print("== tokens/s and MFU, the epochs after the first ==")
    ddp = result.get("ddp")
    for run in runs:
        figures = result.get(run.name, "not run: the time limit came first")
        if isinstance(figures, dict):
            utilisation = f"MFU {figures['mfu']:.1%}" if figures["mfu"] is not None else "MFU unknown (no peak)"
            against = (f", {figures['tokens_per_second'] / ddp['tokens_per_second']:.2f} x DDP's"
                       if isinstance(ddp, dict) else "")
            figures = f"{figures['tokens_per_second']:,.0f} tokens/s, {utilisation}{against}"
        print(f"  {run.label:<34} {figures}", flush=True)


def _print_breakdown(result: dict) -> None:
    phases = result["breakdown"]["seconds_per_step"]
    total = sum(phases.values())
    shares = ", ".join(f"{phase} {seconds * 1000:.1f} ms ({seconds / total:.0%})" for phase, seconds in phases.items())
    print(f"where a step's time goes (synchronised after each phase): {shares}; the loop's step: "
          f"{result['ddp']['step_seconds'] * 1000:.1f} ms")
    if result["ddp"]["mfu"] is not None:
        verdict = "meets" if result["ddp"]["mfu"] >= MFU_TARGET else "is below"
        print(f"MFU {result['ddp']['mfu']:.1%} {verdict} the {MFU_TARGET:.0%} target; most of a step's time is in "
              f"{max(phases, key=phases.get)}")


def _run(label: str, command: list[str], deadline: float) -> None:
    """Run the command until the deadline; past it, end it with every process it started (torchrun's workers)."""
    left = deadline - time.monotonic()
    print(f"== {label} (at most {left:.0f} s) ==\n+ {' '.join(command)}", flush=True)
    if left <= 0:
        raise subprocess.TimeoutExpired(command, 0)
    process = subprocess.Popen(command, start_new_session=True)  # its own process group, to end it whole
    try:
        returncode = process.wait(timeout=left)
    except BaseException:
        end_process_group(process)
        raise
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, command)


def end_process_group(process: subprocess.Popen, grace_seconds: float = 10) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def _write(out: Path, result: dict) -> None:
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
