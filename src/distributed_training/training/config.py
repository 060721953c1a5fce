"""What one training run needs, as a plain dataclass: distributors pickle it to every worker process."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace

from .staged import StagedData
from .strategy import DDP, DEEPSPEED, PRECISIONS, STRATEGIES
from .tracking import TrackingSettings

CHECKPOINTS_DIR = "checkpoints"


@dataclass(frozen=True)
class TrainingConfig:
    data: StagedData  # the staged splits and their statistics, computed once in Spark
    output_dir: str  # rank 0 writes metrics.json here; every rank must be able to reach it
    epochs: int = 8
    batch_size: int = 64  # rows per micro-batch per process
    learning_rate: float = 3e-3
    seed: int = 42
    hidden_sizes: tuple[int, ...] = (64, 64)
    use_gpu: bool = False  # one GPU per process (cuda:LOCAL_RANK) and NCCL; otherwise CPU and gloo
    precision: str = "fp32"  # bf16 / fp16: mixed precision (DDP: autocast; DeepSpeed: as its config says)
    grad_accumulation: int = 1  # micro-batches per optimizer step
    strategy: str = DDP  # or DEEPSPEED, which then needs deepspeed_config
    deepspeed_config: dict | None = None
    checkpoint_dir: str | None = None  # None: output_dir/checkpoints
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch is always checkpointed)
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the newest complete checkpoint in checkpoint_dir
    tracking: TrackingSettings | None = None  # None: no MLflow

    def __post_init__(self):
        for name in ("epochs", "batch_size", "grad_accumulation", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision == "fp16" and not self.use_gpu:
            raise ValueError("fp16 mixed precision needs a GPU: train in fp32 (or bf16) on CPU")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.strategy == DEEPSPEED and not self.deepspeed_config:
            raise ValueError("the deepspeed strategy needs a deepspeed_config (engines.deepspeed builds one)")

    @property
    def checkpoints(self) -> str:
        return self.checkpoint_dir or os.path.join(self.output_dir, CHECKPOINTS_DIR)


def save_config(config: TrainingConfig, path: str) -> None:
    """Write the config as JSON, for processes started by another launcher (torchrun on serverless GPU compute).

    The staged data is named by its folder (its manifest holds the rest). The tracking settings' environment is
    left out: it can hold credentials, and the processes that read this file get their own."""
    content = {field.name: getattr(config, field.name) for field in fields(config)}
    content["data"] = config.data.directory
    content["tracking"] = asdict(replace(config.tracking, environment={})) if config.tracking else None
    partial = path + ".partial"  # a process that reads it while a retry rewrites it gets all of one or the other
    with open(partial, "w") as file:
        json.dump(content, file, indent=2)
    os.replace(partial, path)


def load_config(path: str) -> TrainingConfig:
    """The config `save_config` wrote; FileNotFoundError or ValueError with the reason when it cannot be used."""
    try:
        with open(path) as file:
            content = json.load(file)
    except OSError as error:
        raise FileNotFoundError(f"cannot read the training config {path}: {error.strerror}") from None
    except ValueError as error:
        raise ValueError(f"the training config {path} is not JSON: {error}") from None
    known = {field.name for field in fields(TrainingConfig)}
    if not isinstance(content, dict) or not {"data", "output_dir"} <= set(content):
        raise ValueError(f"the training config {path} names no staged data and output folder: write it with "
                         "`train --handoff-to-torchrun`")
    unknown = sorted(set(content) - known)
    if unknown:
        raise ValueError(f"the training config {path} has unknown fields {', '.join(unknown)}: it was written by "
                         "another version of this package; run `train --handoff-to-torchrun` again with this one")
    content["data"] = StagedData.load(content["data"])
    content["hidden_sizes"] = tuple(content.get("hidden_sizes", TrainingConfig.hidden_sizes))
    if content.get("tracking") is not None:
        content["tracking"] = TrackingSettings(**content["tracking"])
    return TrainingConfig(**content)
