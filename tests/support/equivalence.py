"""The loop's updates on every rank of a real process group, for tests that compare data parallelism with one process.

`ranks_train` runs in processes that torch.multiprocessing starts: each joins a gloo group, reads its own shard of
the staged data, and takes `steps` micro-batches through the real strategy (DDP, FSDP2 or DeepSpeed) and the loop's
`update`, with plain SGD at a constant learning rate, so that the weights' change is the gradient itself (AdamW would
absorb a constant factor on it); then it evaluates the result on its held-out share, and writes its weights, those
metrics, the gradients' norms, the optimizer steps taken and the gradient reductions DDP or FSDP2 made.
`one_process_train` takes, update by update, the union of the ranks' micro-batches on a single process, with no
clipping.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from functools import partial

import torch
import torch.multiprocessing

from distributed_training.data.staged import StagedData
from distributed_training.task_interface import load_task
from distributed_training.training import ranks, strategy as strategies
from distributed_training.training.loop import ShuffledBatches, evaluate, update

SGD_LEARNING_RATE = 0.05


def rank_examples(config, rank: int, world_size: int, split: str = "train") -> tuple:
    data = StagedData.load(config.staging_dir)
    task = load_task(config.task)
    return task.examples(data.shard(split, rank, world_size, require_rows=split == "train"), data.stats,
                         config.task_options)


def rank_batches(config, rank: int, world_size: int, steps: int, per_rank: int) -> list[tuple]:
    examples = tuple(tensor[:per_rank] for tensor in rank_examples(config, rank, world_size))
    batches = ShuffledBatches(examples, config.batch_size, seed=config.seed + rank)
    batches.set_epoch(1)
    return [batch for _, batch in zip(range(steps), batches)]


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=SGD_LEARNING_RATE)


def prepared(config, process):
    """The task, its statistics and a strategy around a fresh model: SGD, a constant rate."""
    data = StagedData.load(config.staging_dir)
    task = load_task(config.task)
    torch.manual_seed(config.seed)
    strategy = strategies.create(config, process)
    strategy.prepare(strategy.build(partial(task.build_model, data.stats, config.task_options)), sgd, lambda step: 1.0)
    strategy.model.train()  # as the loop trains (a model from_pretrained loads is in eval mode)
    return task, data.stats, strategy


def take_steps(config, process, batches: list[tuple], reductions: Counter | None = None,
               norms: list | None = None):
    """The micro-batches in windows of config.grad_accumulation, one update each; the strategy after them.
    `reductions`: counts the gradient reductions (see `count_reductions`); `norms`: gets each update's gradient norm."""
    task, _, strategy = prepared(config, process)
    if reductions is not None:
        count_reductions(strategy, reductions)
    k = config.grad_accumulation
    for first in range(0, len(batches), k):
        _, _, norm = update(task, strategy, [strategy.to_device(batch) for batch in batches[first:first + k]], process)
        if norms is not None:
            assert norm is None or type(norm) is torch.Tensor, f"the norm is a {type(norm)}, not a plain tensor"
            norms.append(None if norm is None else float(norm))
    return strategy


def count_reductions(strategy, reductions: Counter) -> None:
    """Count DDP's all-reduces per gradient bucket (a communication hook that does the default one), or FSDP2's
    reduce-scatters per unit (a reduce-scatter that does the default one)."""
    if isinstance(strategy, strategies.FullyShardedDataParallel):
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

        class Counting(DefaultReduceScatter):
            def __init__(self, unit: str):
                self.unit = unit

            def __call__(self, *args, **kwargs):
                reductions[self.unit] += 1
                return super().__call__(*args, **kwargs)

        for name, module in strategy.model.named_modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(Counting(name or "root"))
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def counting(state, bucket):
        reductions[bucket.index()] += 1
        return allreduce_hook(state, bucket)

    strategy.model.register_comm_hook(None, counting)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ranks_results(config, world_size: int, steps: int, per_rank: int, results) -> list[dict]:
    """`ranks_train` on `world_size` processes; what each rank wrote (results: a folder, a pathlib.Path)."""
    torch.multiprocessing.spawn(ranks_train, args=(world_size, config, steps, per_rank, free_port(), str(results)),
                                nprocs=world_size, join=True)
    return [torch.load(results / f"rank-{rank}.pt", weights_only=False) for rank in range(world_size)]


def largest_difference(left: dict, right: dict) -> float:
    assert left.keys() == right.keys(), sorted(set(left) ^ set(right))[:5]
    return max(float((left[name] - right[name]).abs().max()) for name in left)


def ranks_train(rank: int, world_size: int, config, steps: int, per_rank: int, port: int, results: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size), DS_ACCELERATOR="cpu")
    process = ranks.start(use_gpu=False)
    try:
        reductions, norms = Counter() if config.engine != "deepspeed" else None, []
        strategy = take_steps(config, process, rank_batches(config, rank, world_size, steps, per_rank), reductions,
                              norms)
        task, stats = load_task(config.task), StagedData.load(config.staging_dir).stats
        held_out = evaluate(task, strategy, rank_examples(config, rank, world_size, "test"), stats, process)
        updates = strategy.model.global_steps if config.engine == "deepspeed" else None
        torch.save({"weights": own_weights(strategy), "held_out": held_out, "reductions": dict(reductions or {}),
                    "norms": norms, "deepspeed_updates": updates}, os.path.join(results, f"rank-{rank}.pt"))
    finally:
        ranks.stop(process)
    ranks.leave_now()  # the result is on disk


def own_weights(strategy) -> dict:
    """This rank's own copy of the weights where every rank holds them whole, DDP and ZeRO 1 and 2 (full_state_dict
    gives them to rank 0 alone); under FSDP2 and ZeRO 3, the whole weights on rank 0."""
    partitioned = getattr(strategy.model, "zero_optimization_partition_weights", lambda: False)()
    if isinstance(strategy, strategies.FullyShardedDataParallel) or partitioned:
        return strategy.full_state_dict()
    return {name: value.detach().float().cpu() for name, value in strategy.module.state_dict().items()}


def single_process() -> ranks.Process:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    return ranks.start(use_gpu=False)


def one_process_train(config, world_size: int, steps: int, per_rank: int) -> dict:
    """One process, each micro-batch the ranks' micro-batches of that step together; its weights."""
    assert config.grad_clip == 0, "clipping would hide a constant factor on the gradient"
    shares = [rank_batches(config, rank, world_size, steps, per_rank) for rank in range(world_size)]
    union = [tuple(torch.cat(parts) for parts in zip(*step)) for step in zip(*shares)]
    return take_steps(config, single_process(), union).full_state_dict()


def one_process_evaluation(config, weights: dict, world_size: int) -> dict:
    """The held-out metrics of `weights` over the held-out examples of every rank together, on one process. (They
    are the whole split's for the fare task; the LM cuts each rank's share into whole blocks, so the union lacks the
    whole split's blocks across the shares' seams.)"""
    task, stats, strategy = prepared(config, single_process())
    strategy.module.load_state_dict(weights)
    shares = [rank_examples(config, rank, world_size, "test") for rank in range(world_size)]
    union = tuple(torch.cat(parts) for parts in zip(*shares))
    return evaluate(task, strategy, union, stats, strategy.process)
