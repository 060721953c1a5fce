"""Where this process sits in a distributed run, read from the RANK, WORLD_SIZE and LOCAL_RANK every launcher sets (a
lone process is rank 0 of a world of one, without a group), and the collectives the loop uses across the ranks."""

import contextlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Process:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False  # this process started the process group, so it ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def start(use_gpu: bool, timeout_seconds: float = 1800) -> Process:
    """Join the process group (several processes) and pick the device; a peer missing `timeout_seconds` fails it."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_gpu:
        if local_rank >= torch.cuda.device_count():
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise RuntimeError(f"rank {rank} (local rank {local_rank}) needs a GPU, but this process sees "
                               f"{torch.cuda.device_count()} (CUDA_VISIBLE_DEVICES={visible!r}): start one process per "
                               "visible GPU, or train on CPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Processes on one machine share its cores; more threads than that only make them wait for each other.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world_size))))
    starts_group = world_size > 1 and not dist.is_initialized()  # Ray Train starts and ends the group itself
    if starts_group:
        dist.init_process_group(backend="nccl" if use_gpu else "gloo", init_method="env://",
                                timeout=timedelta(seconds=timeout_seconds))
    return Process(rank, world_size, local_rank, device, owns_group=starts_group)


def stop(process: Process) -> None:
    if process.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def leave_now() -> None:
    """For a rank whose result is delivered: end at once, output flushed, past the native teardown, where a finished
    gloo rank (torch 2.13, CPU) was seen to abort ("terminate called without an active exception") and fail the run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def barrier(process: Process) -> None:
    if process.distributed:
        dist.barrier()


def built_on_main(process: Process, build):
    """The module `build()` makes, built (a pretrained one loaded) on rank 0 alone and on the meta device elsewhere,
    then rank 0's parameters and buffers sent to every rank, on its device: one copy in CPU memory a job, not a rank."""
    # Building draws random numbers on rank 0 only (initial weights): every rank's stream stays where it was.
    with torch.random.fork_rng(devices=[]), torch.device("meta") if not process.is_main else contextlib.nullcontext():
        module = build()
    if not process.distributed:
        return module
    tied = {}  # to_empty gives each module its own parameter: the tied ones are tied again after it
    for name, parameter in module.named_parameters(remove_duplicate=False):
        tied.setdefault(id(parameter), []).append(name)
    module = module.to(process.device) if process.is_main else module.to_empty(device=process.device)
    for first, *others in tied.values():
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, module.get_parameter(first))
    for tensor in [*module.parameters(), *module.buffers()]:
        torch.distributed.broadcast(tensor.detach(), src=0)
    return module


def sum_over_ranks(process: Process, *values: float) -> list[float]:
    return _reduce(process, values, dist.ReduceOp.SUM)


def sum_tensor_over_ranks(process: Process, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on this rank's device summed over all ranks, without waiting on it (no sync with the host)."""
    if process.distributed:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def sum_dict_over_ranks(process: Process, values: dict[str, float]) -> dict[str, float]:
    names = sorted(values)
    return dict(zip(names, _reduce(process, [values[name] for name in names], dist.ReduceOp.SUM)))


def min_over_ranks(process: Process, value: int) -> int:
    return int(_reduce(process, (value,), dist.ReduceOp.MIN)[0])


def max_over_ranks(process: Process, value: float) -> float:
    return _reduce(process, (value,), dist.ReduceOp.MAX)[0]


def _reduce(process: Process, values, op) -> list[float]:
    if not process.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=process.device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()
