"""The DeepSpeed strategy: DeepSpeed's engine behind the loop's `Strategy`, in a module of its own so that a project
without the DeepSpeed engine carries none of it."""

import contextlib
from datetime import timedelta
from typing import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from .deepspeed_config import offload_of
from .ranks import Process
from .strategy import Strategy, unwrapped


class DeepSpeed(Strategy):
    """DeepSpeed's engine: ZeRO and offload as configured; it accumulates, clips and steps the schedule in `step`."""

    def __init__(self, process: Process, precision: str, config: dict, timeout_seconds: float):
        super().__init__(process, precision)
        self.config, self.timeout_seconds, self.window_ends = config, timeout_seconds, True
        zero = config["zero_optimization"]
        self.params = {"zero_stage": zero["stage"], "offload": offload_of(zero)}

    def prepare(self, model: torch.nn.Module, make_optimizer: Callable, schedule: Callable[[int], float]) -> None:
        import deepspeed

        # The process group is already up (ranks.start); DeepSpeed wraps it instead of starting its own.
        deepspeed.init_distributed(dist_backend="nccl" if self.process.device.type == "cuda" else "gloo",
                                   timeout=timedelta(seconds=self.timeout_seconds))
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=make_optimizer(model), config=self.config,
            lr_scheduler=lambda optimizer: LambdaLR(optimizer, schedule))
        self.module = self.model.module
        self.inference_model = self.model  # under ZeRO 3 only the engine's forward gathers the weights

    def micro_batch(self, last: bool):
        self.window_ends = last
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)  # the loop has weighed the micro-batch already
        if not self.window_ends:
            self.model.step()  # DeepSpeed counts micro-batches in step(): inside a window it only counts

    def step(self) -> torch.Tensor | None:
        # The window's last micro-batch is DeepSpeed's accumulation boundary too: there it clips, updates and steps
        # the schedule (test_distributed_equivalence checks that it steps once per window).
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(norm, dtype=torch.float32)

    def save(self, directory: str, tag: str) -> None:
        self.model.save_checkpoint(directory, tag=tag, exclude_frozen_parameters=True)  # a LoRA run's base: not saved

    def load(self, directory: str, tag: str) -> None:
        path, _ = self.model.load_checkpoint(directory, tag=tag, load_module_strict=False)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag} in {directory}")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.model.zero_optimization_partition_weights():  # ZeRO 3: each rank holds a slice of each; rank 0 gets
            state = self.model._zero3_consolidated_16bit_state_dict() or {}  # them whole
        else:
            state = unwrapped(self.module).state_dict() if self.process.is_main else {}
        return {name: value.detach().float().cpu() for name, value in state.items()}
