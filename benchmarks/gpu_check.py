"""The GPU check's Python side: stage synthetic data without Spark, and turn the loop's metrics into throughput and
model FLOPs utilisation (MFU). Driven by gpu_check.sh; needs torch, numpy and pyarrow, nothing else.

    python -m benchmarks.gpu_check plan   --hidden-sizes 8192,8192 --batch-size 8192
    python -m benchmarks.gpu_check stage  --dir DIR --rows N
    python -m benchmarks.gpu_check report --metrics DIR/metrics.json --hidden-sizes ... [--peak-tflops P]
    torchrun ... -m benchmarks.gpu_check zero2 --staging-dir DIR --output-dir OUT --hidden-sizes ... --batch-size B

`zero2` runs the same loop as `train_staged --gpu --bf16`, with the DeepSpeed strategy and a ZeRO stage 2 config
(bf16, torch's Adam, so nothing needs compiling), checkpointing once at the end only.

Model FLOPs per training sample: 2 per weight forward and 4 backward, so 6 x the weights of the linear layers
(biases and activations are noise at these widths). MFU counts the model's FLOPs, not the hardware's.
"""

from __future__ import annotations

import argparse
import json
import sys

# Dense bfloat16 tensor-core peak of each GPU, in TFLOP/s (vendor data sheets, without sparsity). The first name
# contained in torch.cuda.get_device_name() wins, so the more specific names come first.
BF16_PEAK_TFLOPS = (
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("A100", 312.0),
    ("L40S", 362.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
)
FEATURES = 6  # the trips features the staged data has


def weights(hidden_sizes: tuple[int, ...], in_features: int = FEATURES) -> int:
    widths = (in_features, *hidden_sizes, 1)
    return sum(a * b for a, b in zip(widths, widths[1:]))


def flops_per_sample(hidden_sizes: tuple[int, ...]) -> int:
    return 6 * weights(hidden_sizes)


def peak_tflops(device_name: str) -> float | None:
    return next((peak for name, peak in BF16_PEAK_TFLOPS if name in device_name), None)


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def plan(args) -> int:
    per_sample = flops_per_sample(args.hidden_sizes)
    print(f"model: {len(args.hidden_sizes)} hidden layers of {max(args.hidden_sizes)}, "
          f"{weights(args.hidden_sizes) / 1e6:,.0f} M weights ({weights(args.hidden_sizes) * 16 / 2**30:.1f} GiB with "
          f"float32 weights, gradients and Adam's two moments)")
    print(f"training FLOPs: {per_sample / 1e9:.2f} GFLOP per sample, {per_sample * args.batch_size / 1e12:.1f} TFLOP "
          f"per step of {args.batch_size}")
    print("peaks known (dense bf16 TFLOP/s): " + ", ".join(f"{name} {peak:.0f}" for name, peak in BF16_PEAK_TFLOPS))
    return 0


def stage(args) -> int:
    from .synthetic import write_staged

    staged = write_staged(args.dir, train_rows=args.rows, test_rows=max(args.rows // 16, 1024), files=args.files)
    print(f"staged {staged.train_rows:,} training and {staged.test_rows:,} held-out rows in {args.dir}")
    return 0


def report(args) -> int:
    with open(args.metrics) as file:
        metrics = json.load(file)
    name = args.device_name or _device_name()
    peak = args.peak_tflops or peak_tflops(name)
    samples = metrics["samples_per_second"]
    achieved = samples * flops_per_sample(args.hidden_sizes) / 1e12
    result = {
        "label": args.label, "device": name, "world_size": metrics["world_size"], "samples_per_second": samples,
        "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak if peak else None,
        "epoch_seconds": [epoch["train_seconds"] for epoch in metrics["epochs"]],
        "final_train_loss": metrics["final"]["train_loss"],
    }
    mfu = f"MFU {result['mfu']:.1%} of {peak:.0f}" if peak else f"MFU unknown (no peak for {name!r}: pass --peak-tflops)"
    print(f"{args.label}: {samples:,.0f} samples/s after warm-up, {achieved:,.1f} model TFLOP/s, {mfu} TFLOP/s "
          f"on {metrics['world_size']} x {name}")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(result, file, indent=2)
    return 0


def zero2_config(batch_size: int, learning_rate: float) -> dict:
    return {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": learning_rate, "torch_adam": True}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }


def zero2(args) -> int:
    from distributed_training.training.config import TrainingConfig
    from distributed_training.training.loop import train
    from distributed_training.training.staged import StagedData

    config = TrainingConfig(
        data=StagedData.load(args.staging_dir), output_dir=args.output_dir, epochs=args.epochs,
        batch_size=args.batch_size, learning_rate=args.learning_rate, hidden_sizes=args.hidden_sizes, use_gpu=True,
        precision="bf16", strategy="deepspeed", deepspeed_config=zero2_config(args.batch_size, args.learning_rate),
        checkpoint_every=args.epochs, resume=False,
    )
    train(config)
    return 0


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "report", "zero2"):
        command = commands.add_parser(name)
        command.add_argument("--hidden-sizes", type=_sizes, required=True)
        if name != "report":
            command.add_argument("--batch-size", type=int, required=True)
    deepspeed = commands.choices["zero2"]
    deepspeed.add_argument("--staging-dir", required=True)
    deepspeed.add_argument("--output-dir", required=True)
    deepspeed.add_argument("--epochs", type=int, default=3)
    deepspeed.add_argument("--learning-rate", type=float, default=1e-4)
    staging = commands.add_parser("stage")
    staging.add_argument("--dir", required=True)
    staging.add_argument("--rows", type=int, required=True)
    staging.add_argument("--files", type=int, default=1, help="one per process")
    reporting = commands.choices["report"]
    reporting.add_argument("--metrics", required=True)
    reporting.add_argument("--label", default="DDP")
    reporting.add_argument("--peak-tflops", type=float)
    reporting.add_argument("--device-name", help="default: what torch sees")
    reporting.add_argument("--output", help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    return {"plan": plan, "stage": stage, "report": report, "zero2": zero2}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
