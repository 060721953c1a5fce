"""Where a training step's time goes, for the GPU check: the loop's own pieces (its data, strategy, optimizer and
schedule, from the run's config), each phase of a step timed between device synchronisations.

    torchrun --standalone --nproc-per-node N -m benchmarks.gpu_breakdown --config CONFIG --output FILE

Phases: data (the next shuffled batch, copied to the device), forward+backward (the task's loss under autocast and
its backward, which under DDP includes the gradients' all-reduce), optimizer (clipping, AdamW, the schedule).
Synchronising between phases stops the CPU from queueing the next one early, so their sum can exceed the loop's
step time; a share that dominates still says where the time goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

WARM_UP_STEPS = 5


def main(argv: list[str] | None = None) -> int:
    import torch

    from distributed_training.config import from_json
    from distributed_training.data.staged import StagedData
    from distributed_training.task_interface import load_task
    from distributed_training.training import ranks, strategy as strategies
    from distributed_training.training.loop import ShuffledBatches, adamw, learning_rate_schedule

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_breakdown", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--steps", type=int, default=30, help="timed steps, after a few untimed ones")
    parser.add_argument("--output", required=True, help="rank 0 writes the phases' times here as JSON")
    args = parser.parse_args(argv)
    with open(args.config) as file:
        config = from_json(json.load(file), args.config)

    process = ranks.start(config.placement.use_gpu, config.collective_timeout)
    synchronise = torch.cuda.synchronize if process.device.type == "cuda" else (lambda: None)
    try:
        task, options = load_task(config.task), config.task_options
        data = StagedData.load(config.staging_dir)
        examples = task.examples(data.shard("train", process.rank, process.world_size), data.stats, options)
        batches = _endless(ShuffledBatches(examples, config.batch_size, seed=config.seed + process.rank))
        strategy = strategies.create(config, process)
        total_steps = WARM_UP_STEPS + args.steps
        strategy.prepare(task.build_model(data.stats, options),
                         lambda model: adamw(model, config.learning_rate, config.weight_decay, config.adam_betas,
                                             task.parameter_groups(model, options)),
                         learning_rate_schedule(total_steps, config.warmup_fraction, config.lr_schedule,
                                                config.min_lr_ratio))
        strategy.model.train()
        phases = {"data": 0.0, "forward+backward": 0.0, "optimizer": 0.0}
        for step in range(total_steps):
            synchronise()
            started = time.perf_counter()
            batch = strategy.to_device(next(batches))
            synchronise()
            loaded = time.perf_counter()
            with strategy.autocast():
                loss = task.loss(strategy.model, batch)
            strategy.backward(loss)
            synchronise()
            computed = time.perf_counter()
            strategy.step()
            synchronise()
            if step >= WARM_UP_STEPS:
                stepped = time.perf_counter()
                for phase, seconds in zip(phases, (loaded - started, computed - loaded, stepped - computed)):
                    phases[phase] += seconds
        # The slowest rank's time each phase: the others wait for it.
        slowest = {phase: ranks.max_over_ranks(process, seconds) / args.steps
                   for phase, seconds in phases.items()}
        if process.is_main:
            with open(args.output, "w") as file:
                json.dump({"steps": args.steps, "batch_size": config.batch_size, "world_size": process.world_size,
                           "seconds_per_step": slowest}, file, indent=2)
    finally:
        ranks.stop(process)
    return 0


def _endless(batches):
    epoch = 0
    while True:
        epoch += 1
        batches.set_epoch(epoch)
        yield from batches


if __name__ == "__main__":
    sys.exit(main())
