"""How gradients are made and applied, behind one small object: plain data parallel (DDP) or DeepSpeed.

The loop reads the same whichever runs underneath:

    strategy.prepare(model)                       # wrap the model, build the optimizer
    with strategy.autocast():
        loss = loss_function(strategy.model(strategy.inputs(features)), labels)
    strategy.backward(loss)                       # gradients of one micro-batch
    strategy.step()                               # the update, once every `accumulation` micro-batches
    strategy.save(directory, tag) / strategy.load(directory, tag)   # called by every rank (checkpoints)

Both count micro-batches the same way, so gradient accumulation means the same thing under either: the loss is
averaged over `accumulation` micro-batches and the optimizer steps once at the end of each window.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.nn.parallel import DistributedDataParallel

from .distributed import Process

DDP, DEEPSPEED = "ddp", "deepspeed"
STRATEGIES = (DDP, DEEPSPEED)
PRECISIONS = ("fp32", "bf16", "fp16")
HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DDP_STATE_FILE = "state.pt"


class DataParallel:
    """One process: the model as it is. Several: DistributedDataParallel. Mixed precision through autocast (with a
    gradient scaler for fp16); weights and optimizer state stay float32."""

    def __init__(self, process: Process, learning_rate: float, accumulation: int, precision: str):
        self.process, self.learning_rate, self.accumulation, self.precision = (
            process, learning_rate, accumulation, precision)
        self.micro_steps = 0
        self.scaler = torch.amp.GradScaler(process.device.type, enabled=precision == "fp16")

    def prepare(self, model: torch.nn.Module) -> None:
        self.module = model.to(self.process.device)
        self.model = self.module
        if self.process.distributed:
            device_ids = [self.process.local_rank] if self.process.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=self.learning_rate)

    def inputs(self, features: torch.Tensor) -> torch.Tensor:
        return features.to(self.process.device, non_blocking=True)

    def autocast(self):
        return torch.autocast(self.process.device.type, dtype=HALF_TYPES.get(self.precision),
                              enabled=self.precision != "fp32")

    @property
    def at_window_end(self) -> bool:
        return self.micro_steps % self.accumulation == 0

    def backward(self, loss: torch.Tensor) -> None:
        self.micro_steps += 1
        scaled = self.scaler.scale(loss / self.accumulation)
        # Inside a window the ranks keep their gradients to themselves; they average them once, at its end.
        in_window = isinstance(self.model, DistributedDataParallel) and not self.at_window_end
        with self.model.no_sync() if in_window else contextlib.nullcontext():
            scaled.backward()

    def step(self) -> None:
        if not self.at_window_end:
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, directory: str, tag: str) -> None:
        """Rank 0 writes the model and optimizer (the same on every rank under DDP) to directory/tag/state.pt."""
        if not self.process.is_main:
            return
        from .checkpoints import write_atomically

        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict()}
        write_atomically(os.path.join(directory, tag, DDP_STATE_FILE), lambda file: torch.save(state, file))

    def load(self, directory: str, tag: str) -> None:
        state = torch.load(os.path.join(directory, tag, DDP_STATE_FILE), map_location=self.process.device,
                           weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Inference on normalised features: float32 predictions on the CPU."""
        self.model.eval()
        with torch.no_grad(), self.autocast():
            return self.module(self.inputs(features)).float().cpu()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights, float32 on the CPU (every rank calls it)."""
        return {name: value.detach().float().cpu() for name, value in self.module.state_dict().items()}


class DeepSpeed:
    """DeepSpeed's engine: ZeRO sharding, offload, precision and accumulation as its config says. Its own
    save_checkpoint/load_checkpoint write and read every rank's shard of the training state."""

    def __init__(self, process: Process, config: dict):
        self.process, self.config = process, config
        precision = next((name for name in HALF_TYPES if config.get(name, {}).get("enabled")), "fp32")
        self.input_type = HALF_TYPES.get(precision, torch.float32)

    def prepare(self, model: torch.nn.Module) -> None:
        import deepspeed

        # The process group is already up (distributed.start); DeepSpeed wraps it instead of starting its own.
        deepspeed.init_distributed(dist_backend="nccl" if self.process.device.type == "cuda" else "gloo")
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=self.config)

    def inputs(self, features: torch.Tensor) -> torch.Tensor:
        return features.to(self.model.device, dtype=self.input_type, non_blocking=True)

    def autocast(self):
        return contextlib.nullcontext()  # the engine holds the weights in the configured precision itself

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)  # scaled by 1 / gradient_accumulation_steps inside

    def step(self) -> None:
        self.model.step()  # an optimizer step only at the end of an accumulation window

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad():
            return self.model(self.inputs(features)).float().cpu()

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
            state = self.model.module.state_dict()
        return {name: value.detach().float().cpu() for name, value in state.items()}


def create(name: str, process: Process, learning_rate: float, accumulation: int, precision: str,
           deepspeed_config: dict | None):
    if name == DEEPSPEED:
        return DeepSpeed(process, deepspeed_config)
    return DataParallel(process, learning_rate, accumulation, precision)
