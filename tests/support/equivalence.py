"""The loop's steps on every rank of a real process group, for tests that compare data parallelism with one process.

`ranks_train` runs in processes that torch.multiprocessing starts: each joins a gloo group, reads its own shard of
the staged data, and takes `steps` micro-batches through the real strategy (DDP or DeepSpeed), the task's loss, the
loop's AdamW and schedule, then writes its final weights. `one_process_train` takes, step by step, the union of the
ranks' micro-batches through DDP on a single process.
"""

from __future__ import annotations

import os

import torch

from distributed_training.task_interface import load_task
from distributed_training.training import distributed, strategy as strategies
from distributed_training.training.data import StagedData, read_shard
from distributed_training.training.loop import ShuffledBatches, adamw, warmup_then_cosine

UPDATES = 20  # the schedule's length: the few steps taken stay in its warm-up and early decay


def rank_examples(config, rank: int, world_size: int) -> tuple:
    data = StagedData.load(config.staging_dir)
    task = load_task(config.task)
    return task.examples(read_shard(data.train_dir, rank, world_size), data.stats, config.task_options)


def rank_batches(config, rank: int, world_size: int, steps: int, per_rank: int) -> list[tuple]:
    examples = tuple(tensor[:per_rank] for tensor in rank_examples(config, rank, world_size))
    batches = ShuffledBatches(examples, config.batch_size, seed=config.seed + rank)
    batches.set_epoch(1)
    return [batch for _, batch in zip(range(steps), batches)]


def take_steps(config, process, batches: list[tuple]) -> dict:
    data = StagedData.load(config.staging_dir)
    task = load_task(config.task)
    torch.manual_seed(config.seed)
    strategy = strategies.create(config, process)
    strategy.prepare(task.build_model(data.stats, config.task_options),
                     lambda model: adamw(model, config.learning_rate, config.weight_decay),
                     warmup_then_cosine(UPDATES, 0.1))
    for batch in batches:
        loss = task.loss(strategy.model, strategy.to_device(batch))
        strategy.backward(loss)
        strategy.step()
    return strategy.full_state_dict()


def ranks_train(rank: int, world_size: int, config, steps: int, per_rank: int, port: int, results: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size), DS_ACCELERATOR="cpu")
    process = distributed.start(use_gpu=False)
    try:
        weights = take_steps(config, process, rank_batches(config, rank, world_size, steps, per_rank))
        torch.save(weights, os.path.join(results, f"rank-{rank}.pt"))
    finally:
        distributed.stop(process)
    distributed.leave_now()  # the result is on disk


def one_process_train(config, world_size: int, steps: int, per_rank: int) -> dict:
    """DDP on one process, each micro-batch the ranks' micro-batches of that step together."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    shares = [rank_batches(config, rank, world_size, steps, per_rank) for rank in range(world_size)]
    union = [tuple(torch.cat(parts) for parts in zip(*step)) for step in zip(*shares)]
    return take_steps(config, distributed.start(use_gpu=False), union)
