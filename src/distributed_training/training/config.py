"""What one training run needs, as a plain dataclass: distributors pickle it to every worker process."""

from __future__ import annotations

from dataclasses import dataclass

from .staged import StagedData


@dataclass(frozen=True)
class TrainingConfig:
    data: StagedData  # the staged splits and their statistics, computed once in Spark
    output_dir: str  # rank 0 writes metrics.json here; every rank must be able to reach it
    epochs: int = 8
    batch_size: int = 64
    learning_rate: float = 3e-3
    seed: int = 42
    hidden_sizes: tuple[int, ...] = (64, 64)
    use_gpu: bool = False  # one GPU per process (cuda:LOCAL_RANK) and NCCL; otherwise CPU and gloo
    bf16: bool = False  # forward and loss under bfloat16 autocast (weights and optimizer stay float32)

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
