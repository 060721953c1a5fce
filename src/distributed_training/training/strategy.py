"""How gradients are made and applied, behind one small object: plain data parallel (DDP) or DeepSpeed.

The loop reads the same whichever runs underneath:

    strategy.prepare(model, make_optimizer, schedule)   # wrap the model; the loop's optimizer and LR schedule
    with strategy.autocast():
        loss = task.loss(strategy.model, strategy.to_device(batch))
    strategy.backward(loss)                             # gradients of one micro-batch
    strategy.step()                                     # clip, update, advance the schedule: once per window
    strategy.save(directory, tag) / strategy.load(directory, tag)   # every rank calls them (checkpoints)

Both count micro-batches the same way, so gradient accumulation means the same under either: the loss is averaged
over `accumulation` micro-batches and the optimizer steps once at the end of each window. Mixed precision is
autocast under both (DeepSpeed then keeps its weights in that precision, with fp32 master weights in its optimizer).
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from ..files import write_atomically
from .distributed import Process

HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
STATE_FILE = "state.pt"


class Strategy:
    """What both strategies share: the device, precision and accumulation window."""

    def __init__(self, process: Process, precision: str, accumulation: int):
        self.process, self.precision, self.accumulation = process, precision, accumulation

    def to_device(self, batch: tuple) -> tuple:
        return tuple(tensor.to(self.process.device, non_blocking=True) for tensor in batch)

    def autocast(self):
        return torch.autocast(self.process.device.type, dtype=HALF_TYPES.get(self.precision),
                              enabled=self.precision != "fp32")


class DataParallel(Strategy):
    """One process: the model as it is. Several: DistributedDataParallel. Weights and optimizer state in float32;
    fp16 gets a gradient scaler."""

    def __init__(self, process: Process, precision: str, accumulation: int, grad_clip: float):
        super().__init__(process, precision, accumulation)
        self.grad_clip = grad_clip
        self.micro_steps = 0
        self.scaler = torch.amp.GradScaler(process.device.type, enabled=precision == "fp16")

    def prepare(self, model: torch.nn.Module, make_optimizer: Callable, schedule: Callable[[int], float]) -> None:
        self.module = model.to(self.process.device)
        self.model = self.module
        if self.process.distributed:
            device_ids = [self.process.local_rank] if self.process.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        self.optimizer = make_optimizer(self.module)
        self.scheduler = LambdaLR(self.optimizer, schedule)
        self.inference_model = self.module  # DDP's own forward would broadcast buffers: a collective per batch

    @property
    def at_window_end(self) -> bool:
        return self.micro_steps % self.accumulation == 0

    def backward(self, loss: torch.Tensor) -> None:
        self.micro_steps += 1
        # Inside a window the ranks keep their gradients to themselves; they average them once, at its end.
        in_window = isinstance(self.model, DistributedDataParallel) and not self.at_window_end
        with self.model.no_sync() if in_window else contextlib.nullcontext():
            self.scaler.scale(loss / self.accumulation).backward()

    def step(self) -> None:
        if not self.at_window_end:
            return
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, directory: str, tag: str) -> None:
        """Rank 0 writes the training state (the same on every rank under DDP) to directory/tag/state.pt."""
        if self.process.is_main:
            state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}
            write_atomically(os.path.join(directory, tag, STATE_FILE), lambda file: torch.save(state, file))

    def load(self, directory: str, tag: str) -> None:
        state = torch.load(os.path.join(directory, tag, STATE_FILE), map_location=self.process.device,
                           weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights, float32 on the CPU (every rank calls it)."""
        return {name: value.detach().float().cpu() for name, value in self.module.state_dict().items()}


class DeepSpeed(Strategy):
    """DeepSpeed's engine: ZeRO sharding and offload as its config says; accumulation, clipping and the schedule's
    steps happen inside `step`. Its save_checkpoint/load_checkpoint write and read every rank's shard."""

    def __init__(self, process: Process, precision: str, accumulation: int, config: dict, timeout_seconds: float):
        super().__init__(process, precision, accumulation)
        self.config, self.timeout_seconds = config, timeout_seconds

    def prepare(self, model: torch.nn.Module, make_optimizer: Callable, schedule: Callable[[int], float]) -> None:
        import deepspeed

        # The process group is already up (distributed.start); DeepSpeed wraps it instead of starting its own.
        deepspeed.init_distributed(dist_backend="nccl" if self.process.device.type == "cuda" else "gloo",
                                   timeout=timedelta(seconds=self.timeout_seconds))
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=make_optimizer(model), config=self.config,
            lr_scheduler=lambda optimizer: LambdaLR(optimizer, schedule))
        self.module = self.model.module
        self.inference_model = self.model  # under ZeRO 3 only the engine's forward gathers the weights

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)  # scaled by 1 / gradient_accumulation_steps inside

    def step(self) -> None:
        self.model.step()  # clips, updates and steps the schedule only at the end of an accumulation window

    def save(self, directory: str, tag: str) -> None:
        self.model.save_checkpoint(directory, tag=tag)

    def load(self, directory: str, tag: str) -> None:
        path, _ = self.model.load_checkpoint(directory, tag=tag)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag} in {directory}")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.model.zero_optimization_partition_weights():  # ZeRO 3: every rank holds a slice of each weight
            state = self.model._zero3_consolidated_16bit_state_dict() or {}
        else:
            state = self.module.state_dict()
        return {name: value.detach().float().cpu() for name, value in state.items()}


def checkpoint_weights(directory: str, tag: str) -> dict[str, torch.Tensor]:
    """The model's float32 weights in a checkpoint either strategy wrote (--init-from reads them on every rank)."""
    state_file = os.path.join(directory, tag, STATE_FILE)
    if os.path.exists(state_file):
        return torch.load(state_file, map_location="cpu", weights_only=True)["model"]
    try:  # DeepSpeed's own layout: the weights rebuilt from its fp32 master copy, whatever the ZeRO stage
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError:
        raise FileNotFoundError(f"{os.path.join(directory, tag)} holds no {STATE_FILE}; if DeepSpeed wrote it, "
                                "reading it needs deepspeed installed") from None
    return dict(get_fp32_state_dict_from_zero_checkpoint(directory, tag=tag))


def create(config, process: Process) -> Strategy:
    """DeepSpeed for the deepspeed engine, DDP for every other (a resolved config: its precision is set)."""
    if config.engine == "deepspeed":
        from .deepspeed_config import deepspeed_config

        return DeepSpeed(process, config.precision, config.grad_accumulation,
                         deepspeed_config(config, process.world_size, config.precision), config.collective_timeout)
    return DataParallel(process, config.precision, config.grad_accumulation, config.grad_clip)
