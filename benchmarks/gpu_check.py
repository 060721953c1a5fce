"""The GPU check: the causal-LM task at GPT-2 small's shape, trained by the project's loop under torchrun on every
GPU of this machine, in bf16; its tokens per second and MFU against the GPU's dense peak, where the step's time
goes, and DDP against DeepSpeed ZeRO-2 where there are two GPUs or more. `bash benchmarks/gpu_check.sh` runs it.

    python -m benchmarks.gpu_check [--dry-run] [--out DIR] [--batch-size B] [--steps S] [--epochs E]

The data is synthetic text staged with pyarrow in the shape Spark stages it (no Spark on the GPU machine); the run
is what `python -m distributed_training.engines.torchrun --config FILE` does on a serverless GPU node. Without a GPU
it prints its plan and writes nothing (a dry run); `--cpu-processes N` runs it on CPU processes instead (tests).
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
MFU_TARGET = 0.45  # GPT-2 small through the loop on one H200 (issue 16)
LEARNING_RATE = 6e-4  # GPT-2 small's; the loop's default suits the tiny model
BREAKDOWN_STEPS = 30
# A guess, for the dry run's estimate only: a launch's imports, process group, data, model and final checkpoint.
STARTUP_SECONDS_PER_LAUNCH = 45
ASSUMED_MFU = 0.35  # for the estimate of the training time only
TEST_DOCUMENTS_PER_PROCESS = 200


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
class Model:
    size: str
    layers: int
    heads: int
    width: int
    context: int
    parameters: int
    matmul_parameters: int  # without the position embedding
    flops_per_token: int  # the task's own count, the loop's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run and write nothing")
    parser.add_argument("--out", default=os.path.join("build", "gpu-check"), help="results (default build/gpu-check)")
    parser.add_argument("--model-size", default="gpt2-small", help="the causal_lm preset (default gpt2-small)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per GPU per step (default 32)")
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch (default 50)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs; the first is warm-up (default 3)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense peak, where the lookup has none")
    parser.add_argument("--time-limit", type=float, default=450, help="seconds for everything (default 450)")
    parser.add_argument("--gpus", type=int, help="plan for this many GPUs (a dry run)")
    parser.add_argument("--device-name", help="plan for this GPU, as nvidia-smi names it (a dry run)")
    parser.add_argument("--cpu-processes", type=int, help="run on this many CPU processes instead (tests)")
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
    _print_plan(args, machine, model)
    if dry_run:
        print("dry run: nothing was run or written")
        return 0
    return _check(args, machine, model, deadline)


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


def _peak_tflops(args, machine: Machine) -> float | None:
    return args.peak_tflops or (machine.peak.tflops if machine.peak else None)


def _print_plan(args, machine: Machine, model: Model) -> None:
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
    print(f"data: synthetic TPC-H comments, {args.steps} steps x {args.batch_size} sequences a process an epoch, "
          f"{args.epochs} epochs (the first is warm-up and left out of the figures)")
    print("commands:")
    for command in _commands(args, machine):
        print("  + " + " ".join(command))
    if machine.processes < 2:
        print("  (one process: DDP and ZeRO-2 communicate nothing, no gradients to average and no shards to gather, "
              "so they are not compared; that needs 2 GPUs or more)")
    launches, loop_runs = len(_commands(args, machine)), 2 if machine.processes >= 2 else 1
    if peak:
        training = loop_runs * args.epochs * args.steps * model.flops_per_token * tokens_per_step / (
            machine.processes * peak * 1e12 * ASSUMED_MFU)
        print(f"expected: about {(launches * STARTUP_SECONDS_PER_LAUNCH + training) / 60:.1f} min "
              f"({launches} launches x ~{STARTUP_SECONDS_PER_LAUNCH} s of start-up and checkpoint, plus "
              f"{training:.0f} s of training at an assumed {ASSUMED_MFU:.0%} MFU); stops at {args.time_limit:.0f} s")
    else:
        print(f"expected: no estimate without a peak; stops at {args.time_limit:.0f} s")


def _commands(args, machine: Machine) -> list[list[str]]:
    out = Path(args.out)
    commands = [_loop_command(out / "ddp"), _breakdown_command(out / "ddp", machine)]
    if machine.processes >= 2:
        commands.append(_loop_command(out / "zero2"))
    return commands


def _loop_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "distributed_training.engines.torchrun", "--config", str(run_dir / "config.json")]


def _breakdown_command(run_dir: Path, machine: Machine) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(machine.processes),
            "-m", "benchmarks.gpu_breakdown", "--config", str(run_dir / "config.json"), "--steps",
            str(BREAKDOWN_STEPS), "--output", str(run_dir / "breakdown.json")]


# ------------------------------------------------------------------ the check itself

def _check(args, machine: Machine, model: Model, deadline: float) -> int:
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not (out / "staging").exists() and not (out / "result.json").exists():
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
              "mfu_target": MFU_TARGET}
    print("== staging synthetic text (pyarrow, no Spark) ==", flush=True)
    _stage(out / "staging", args, machine, model)
    strategies = {"ddp": "torch_distributor", **({"zero2": "deepspeed"} if machine.processes >= 2 else {})}
    for name, engine in strategies.items():
        _write_config(out / name, engine, args, machine, out / "staging")
    try:
        result["ddp"] = _loop_run(out / "ddp", "DDP", args, machine, model, deadline)
        _write(out, result)
        _run("where the time goes", _breakdown_command(out / "ddp", machine), deadline)
        result["breakdown"] = json.loads((out / "ddp" / "breakdown.json").read_text())
        _print_breakdown(result)
        if "zero2" in strategies:
            if importlib.util.find_spec("deepspeed") is None:
                result["zero2"] = "skipped: deepspeed is not importable here"
            else:
                result["zero2"] = _loop_run(out / "zero2", "DeepSpeed ZeRO-2", args, machine, model, deadline)
                ratio = result["zero2"]["tokens_per_second"] / result["ddp"]["tokens_per_second"]
                result["zero2_over_ddp"] = ratio
                print(f"ZeRO-2 / DDP tokens/s: {ratio:.2f} over {machine.processes} GPUs")
        else:
            result["zero2"] = "not compared: one process communicates nothing"
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as error:
        result["error"] = str(error)
        _write(out, result)
        print(f"error: {error}", file=sys.stderr)
        return 1
    _write(out, result)
    return 0


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


def _write_config(run_dir: Path, engine: str, args, machine: Machine, staging: Path) -> None:
    from distributed_training.config import Config, to_json
    from distributed_training.tasks.causal_lm import Options

    config = Config(engine=engine, task=TASK, local=not machine.on_gpu, table="synthetic", output_dir=str(run_dir),
                    gpus_per_node=machine.processes if machine.on_gpu else 0,
                    processes=None if machine.on_gpu else machine.processes, precision=machine.precision,
                    epochs=args.epochs, batch_size=args.batch_size, learning_rate=LEARNING_RATE,
                    log_every_steps=args.steps,  # one report an epoch: the run's figures leave the first out
                    checkpoint_every=args.epochs, keep_checkpoints=1, resume=False, tracking=False,
                    zero_stage=2 if engine == "deepspeed" else None, task_options=Options(model_size=args.model_size))
    run_dir.mkdir(parents=True)
    (run_dir / "staging").symlink_to(staging.resolve())  # the loop reads OUTPUT_DIR/staging
    (run_dir / "config.json").write_text(json.dumps(to_json(config), indent=2))


def _loop_run(run_dir: Path, label: str, args, machine: Machine, model: Model, deadline: float) -> dict:
    _run(label, _loop_command(run_dir), deadline)
    shutil.rmtree(run_dir / "checkpoints")  # the final weights and optimizer state, about 1 GB, of no use here
    metrics = json.loads((run_dir / "metrics.json").read_text())
    tokens_per_second = metrics["tokens_per_second"]  # the loop's figure, as MLflow has it
    peak = _peak_tflops(args, machine)
    figures = {"label": label, "tokens_per_second": tokens_per_second,
               "tokens_per_second_per_process": tokens_per_second / machine.processes,
               "step_seconds": args.batch_size * model.context * machine.processes / tokens_per_second,
               "achieved_tflops_per_process": tokens_per_second * model.flops_per_token / machine.processes / 1e12,
               "mfu": mfu(tokens_per_second, model.flops_per_token, machine.processes, peak) if peak else None,
               "epoch_seconds": [epoch["train_seconds"] for epoch in metrics["epochs"]],
               "train_examples": metrics["train_examples"], "final_train_loss": metrics["final"]["train_loss"]}
    utilisation = f"MFU {figures['mfu']:.1%}" if figures["mfu"] is not None else "MFU unknown (no peak)"
    print(f"{label}: {tokens_per_second:,.0f} tokens/s over {machine.processes} process(es) after the first epoch, "
          f"{figures['achieved_tflops_per_process']:,.1f} TFLOP/s a process, {utilisation}; a step takes "
          f"{figures['step_seconds'] * 1000:.1f} ms", flush=True)
    return figures


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
