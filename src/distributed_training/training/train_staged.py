"""Run the training loop on already-staged data, without Spark: under torchrun on serverless GPU compute, for
benchmarks and GPU checks.

    torchrun --nproc-per-node 2 -m distributed_training.training.train_staged --config OUT/torchrun/config.json
    torchrun --nproc-per-node 2 -m distributed_training.training.train_staged --staging-dir DIR --output-dir OUT

--config is the whole run as `train --handoff-to-torchrun` planned it (the serverless GPU task's command runs
this); otherwise the options below say how to train on a staging folder that `train` wrote (OUTPUT_DIR/staging:
train/, test/, manifest.json) for the same number of processes or fewer. torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK and MASTER_ADDR/PORT; the loop joins from those.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="a training config written by `train --handoff-to-torchrun`")
    source.add_argument("--staging-dir", help="a folder staged by `train` (holds manifest.json)")
    parser.add_argument("--output-dir", help="rank 0 writes metrics.json here (required with --staging-dir)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--gpu", action="store_true", help="one GPU per process (cuda:LOCAL_RANK) and NCCL")
    parser.add_argument("--hidden-sizes", type=_sizes, default=(64, 64), metavar="W,W,...",
                        help="widths of the model's hidden layers (default 64,64)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="bf16/fp16: mixed precision through autocast (fp16 on GPU only)")
    parser.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="--precision bf16")
    parser.add_argument("--grad-accumulation", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="start over instead of resuming from OUTPUT_DIR/checkpoints")
    args = parser.parse_args(argv)
    if args.staging_dir and not args.output_dir:
        parser.error("--staging-dir needs --output-dir")

    from .config import TrainingConfig, load_config
    from .loop import train
    from .staged import StagedData

    try:
        config = load_config(args.config) if args.config else TrainingConfig(
            data=StagedData.load(args.staging_dir), output_dir=args.output_dir, epochs=args.epochs,
            batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed, use_gpu=args.gpu,
            hidden_sizes=args.hidden_sizes, precision=args.precision,
            grad_accumulation=args.grad_accumulation, resume=args.resume,
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metrics = train(config)
    if os.environ.get("RANK", "0") == "0":
        print(f"metrics written to {metrics['metrics_file']}")
    return 0


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every width must be at least 1")
    return sizes


if __name__ == "__main__":
    sys.exit(main())
