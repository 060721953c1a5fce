"""How gradients are made and applied behind one small object, the same to the loop for DDP, FSDP2 or DeepSpeed (see
loop.update). Mixed precision is autocast (DeepSpeed: fp32 master weights in its optimizer). A checkpoint holds the
plain model's weights, whatever wraps it (DDP, FSDP2, DeepSpeed, torch.compile), but not its frozen parameters (a LoRA
run's base model), which the task's build_model makes again."""

import contextlib
import os
import warnings
from typing import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, \
    set_model_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from ..files import write_atomically
from .checkpoints import DamagedCheckpoint, read_checkpoint_file
from .ranks import Process, built_on_main

HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
STATE_FILE = "state.pt"


class Strategy:
    params: dict = {}  # what MLflow records of the strategy beside the run's options

    def __init__(self, process: Process, precision: str):
        self.process, self.precision = process, precision

    def build(self, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The model `build()` makes, for prepare: loaded on rank 0 alone, its weights sent to the others."""
        return built_on_main(self.process, build)

    def to_device(self, batch: tuple) -> tuple:
        return tuple(tensor.to(self.process.device, non_blocking=True) for tensor in batch)

    def autocast(self):
        return torch.autocast(self.process.device.type, dtype=HALF_TYPES.get(self.precision),
                              enabled=self.precision != "fp32")

    def follow_schedule(self) -> None:
        """After a resume: this run's rate at the step reached (the optimizer's state has the saved run's)."""
        for group, base, multiplier in zip(self.scheduler.optimizer.param_groups, self.scheduler.base_lrs,
                                           self.scheduler.lr_lambdas):
            group["lr"] = base * multiplier(self.scheduler.last_epoch)

    @property
    def learning_rate(self) -> float:
        """The rate the next update uses (a parameter group's own is its lr_scale times this: loop.adamw)."""
        group = self.scheduler.optimizer.param_groups[0]
        return group["lr"] / group.get("lr_scale", 1.0)


class DataParallel(Strategy):
    """One process: the model as is; several: DDP. Weights and optimizer state in fp32; fp16 gets a gradient scaler."""

    scaler_type = torch.amp.GradScaler

    def __init__(self, process: Process, precision: str, grad_clip: float):
        super().__init__(process, precision)
        self.grad_clip = grad_clip
        self.scaler = self.scaler_type(process.device.type, enabled=precision == "fp16")

    def prepare(self, model: torch.nn.Module, make_optimizer: Callable, schedule: Callable[[int], float]) -> None:
        self.model = self.module = model.to(self.process.device)
        if self.process.distributed:
            device_ids = [self.process.local_rank] if self.process.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        self.optimizer = make_optimizer(self.module)
        self.scheduler = LambdaLR(self.optimizer, schedule)
        self.inference_model = self.module  # DDP's own forward would broadcast buffers: a collective per batch

    def micro_batch(self, last: bool):
        # DDP decides in the forward pass whether the backward reduces: both run under no_sync inside a window, so
        # the ranks keep their gradients to themselves until the window's last micro-batch averages them, once.
        if isinstance(self.model, DistributedDataParallel) and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self) -> torch.Tensor:
        """Clip, update, advance the schedule; the gradients' global norm before clipping (a tensor on the device)."""
        self.scaler.unscale_(self.optimizer)
        norm = (torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip) if self.grad_clip > 0 else
                torch.nn.utils.get_total_norm([p.grad for p in self.module.parameters() if p.grad is not None]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def save(self, directory: str, tag: str) -> None:
        """Rank 0 writes the training state (the same on every rank under DDP) to directory/tag/state.pt."""
        if self.process.is_main:
            state = {"model": trained_weights(unwrapped(self.module)), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}
            write_atomically(os.path.join(directory, tag, STATE_FILE), lambda file: torch.save(state, file))

    def load(self, directory: str, tag: str) -> None:
        state = read_checkpoint_file(os.path.join(directory, tag, STATE_FILE), map_location=self.process.device,
                                     weights_only=True)
        load_trained_weights(unwrapped(self.module), state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's float32 weights on the CPU, on rank 0 (every rank calls it; the others get nothing)."""
        if not self.process.is_main:
            return {}
        return {name: value.detach().float().cpu() for name, value in unwrapped(self.module).state_dict().items()}


class FullyShardedDataParallel(DataParallel):
    """FSDP2 (fully_shard): each rank keeps a slice of every fp32 weight, gradient and optimizer state; each block of
    the model's ModuleLists is a unit (gathered in 16-bit under mixed precision), the rest the root's."""

    scaler_type = ShardedGradScaler

    def build(self, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The model's structure on the meta device on every rank, which prepare shards before any weight exists;
        rank 0 also builds it for real, on the CPU, to send each rank its shards from (no rank holds a whole model
        on its device, and a node one in CPU memory)."""
        with torch.random.fork_rng(devices=[]):  # building draws no random number of the run's
            self.loaded = build() if self.process.is_main else None
            with torch.device("meta"):
                return build()

    def prepare(self, model: torch.nn.Module, make_optimizer: Callable, schedule: Callable[[int], float]) -> None:
        mesh = init_device_mesh(self.process.device.type, (self.process.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=HALF_TYPES.get(self.precision), reduce_dtype=torch.float32)
        blocks = [block for parent in model.modules() if isinstance(parent, torch.nn.ModuleList) for block in parent]
        for block in reversed(blocks):  # a unit nested in another is sharded first
            fully_shard(block, mesh=mesh, mp_policy=policy)
        self.model = self.module = self.inference_model = fully_shard(model, mesh=mesh, mp_policy=policy)
        self.model.to_empty(device=self.process.device)  # each rank's shards, unset
        loaded, self.loaded = self.loaded, None
        set_model_state_dict(self.model, loaded.state_dict() if loaded else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        for name, buffer in self.model.named_buffers():  # whole on every rank; some not in a state dict (RoPE's)
            if loaded:
                buffer.copy_(loaded.get_buffer(name))
            torch.distributed.broadcast(buffer, src=0)
        del loaded
        self.optimizer = make_optimizer(self.module)
        self.scheduler = LambdaLR(self.optimizer, schedule)

    def micro_batch(self, last: bool):
        self.model.set_requires_gradient_sync(last)  # FSDP2's no_sync: inside a window gradients stay unreduced
        return contextlib.nullcontext()

    def step(self) -> torch.Tensor:
        norm = super().step()
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def _state(self) -> dict:
        model, optimizer = get_state_dict(self.model, self.optimizer,
                                          options=StateDictOptions(ignore_frozen_params=True))
        return {"model": model, "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def save(self, directory: str, tag: str) -> None:
        dcp.save(self._state(), checkpoint_id=os.path.join(directory, tag))

    def load(self, directory: str, tag: str) -> None:
        sharded_metadata(os.path.join(directory, tag))
        state = self._state()  # what to read, and where: DCP loads into it
        try:
            dcp.load(state, checkpoint_id=os.path.join(directory, tag))
        except dcp.CheckpointException as error:  # a BaseException, on every rank: for the resume, a damaged one
            raise RuntimeError(f"ranks {sorted(error.failures)} cannot read their part of it") from error
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(strict=False))  # the frozen parameters: not saved (_state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's float32 weights on the CPU, on rank 0 (every rank calls it; the others get nothing)."""
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def frozen(model: torch.nn.Module) -> set[str]:
    """The names of the parameters that do not train (every name of a tied one)."""
    return {name for name, parameter in model.named_parameters(remove_duplicate=False) if not parameter.requires_grad}


def trained_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of the model: its state but the frozen parameters."""
    left_out = frozen(model)
    return {name: value for name, value in model.state_dict().items() if name not in left_out}


def load_trained_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or (missing := sorted(set(missing) - frozen(model))):
        raise RuntimeError(f"the checkpoint's weights do not fit the model (missing {missing[:3]}, unexpected "
                           f"{sorted(unexpected)[:3]})")


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model torch.compile wrapped (its weights under the plain model's names), or the model itself."""
    return getattr(model, "_orig_mod", model)


def sharded_metadata(folder: str):
    """FSDP2's checkpoint's metadata, once it covers every tensor whole (DCP would leave a gap as it was)."""
    metadata = read_checkpoint_file(os.path.join(folder, ".metadata"),
                                    lambda _: dcp.FileSystemReader(folder).read_metadata())
    for name, item in metadata.state_dict_metadata.items():
        if hasattr(item, "chunks") and sum(chunk.sizes.numel() for chunk in item.chunks) < item.size.numel():
            raise DamagedCheckpoint(f"{folder}/.metadata", f"lists only part of {name}: a rank's shards are missing")
    return metadata


def checkpoint_weights(directory: str, tag: str) -> dict[str, torch.Tensor]:
    """The model's float32 weights in a checkpoint any strategy wrote (--init-from reads them on the loading rank)."""
    state_file = os.path.join(directory, tag, STATE_FILE)
    if os.path.exists(state_file):
        return read_checkpoint_file(state_file, map_location="cpu", weights_only=True)["model"]
    folder = os.path.join(directory, tag)
    if any(name == ".metadata" or name.endswith(".distcp") for name in os.listdir(folder)):  # FSDP2's shards
        weights = {name.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
                   for name, item in sharded_metadata(folder).state_dict_metadata.items() if name.startswith("model.")}
        try:  # each rank reads them on its own, as dcp warns that it assumes
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
                dcp.load({"model": weights}, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
        except dcp.CheckpointException:
            raise DamagedCheckpoint(folder, "has a shard that does not read (missing, cut short or overwritten)") \
                from None
        return weights
    try:  # DeepSpeed's own layout: the weights rebuilt from its fp32 master copy, whatever the ZeRO stage
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError:
        raise FileNotFoundError(f"{os.path.join(directory, tag)} holds no {STATE_FILE}; if DeepSpeed wrote it, "
                                "reading it needs deepspeed installed") from None
    return dict(get_fp32_state_dict_from_zero_checkpoint(directory, tag=tag))


def create(config, process: Process) -> Strategy:
    """DeepSpeed for its engine, FSDP2 for --parallelism fsdp2 on several processes, else DDP (a resolved config)."""
    if config.engine == "deepspeed":
        from .deepspeed_config import deepspeed_config
        from .deepspeed_strategy import DeepSpeed  # a project without the DeepSpeed engine has neither module

        return DeepSpeed(process, config.precision, deepspeed_config(config, process.world_size, config.precision),
                         config.collective_timeout)
    if config.parallelism == "fsdp2" and process.distributed:
        return FullyShardedDataParallel(process, config.precision, config.grad_clip)
    return DataParallel(process, config.precision, config.grad_clip)
