"""The training loop, the same on every rank under every launcher (TorchDistributor, DeepSpeed, Ray Train, torchrun).

It knows nothing of Spark: it reads this rank's share of the staged parquet files, trains the fare model with
DistributedDataParallel when there is more than one process, and evaluates on the held-out split after every epoch.
Quality is stated against the simplest possible model, predicting the training mean, so a number means something.

`train` is what the launchers run: a module-level function of one picklable argument. Every rank returns the same
metrics (they are all-reduced), because TorchDistributor keeps the return value of whichever rank finishes last.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from . import distributed
from .config import TrainingConfig
from .model import FareRegressor
from .staged import ColumnStats, StagedData, read_shard

METRICS_FILE = "metrics.json"
EVALUATION_BATCH = 8192


def train(config: TrainingConfig) -> dict:
    """Train on this rank's share of the data and return the run's metrics; rank 0 also writes them to
    output_dir/metrics.json."""
    process = distributed.start(config.use_gpu)
    try:
        return _train(config, process)
    finally:
        distributed.stop(process)


def _train(config: TrainingConfig, process: distributed.Process) -> dict:
    started = time.perf_counter()
    data = config.data
    log = print if process.is_main else (lambda *args, **kwargs: None)
    torch.manual_seed(config.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)

    train_features, train_labels = _load_split(data, data.train_dir, process, require_rows=True)
    # DDP needs every rank to take the same number of steps: cut every share to the smallest one.
    rows_per_rank = distributed.min_over_ranks(process, len(train_labels))
    if rows_per_rank == 0:
        raise RuntimeError(f"a rank got no training rows from {data.train_dir}: stage the data again")
    train_features, train_labels = train_features[:rows_per_rank], train_labels[:rows_per_rank]
    test_features, test_labels = _load_split(data, data.test_dir, process, require_rows=False)
    normalised_train_labels = (train_labels - data.label_stats.mean) / data.label_stats.std

    loader = ShuffledBatches(train_features, normalised_train_labels, config.batch_size, config.seed + process.rank)
    model = FareRegressor(len(data.feature_columns), config.hidden_sizes).to(process.device)
    trained = DistributedDataParallel(model, device_ids=[process.local_rank] if config.use_gpu else None) \
        if process.distributed else model
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)

    log(f"training on {process.world_size} process(es), {process.device.type}: {rows_per_rank} rows per rank, "
        f"{len(loader)} steps per epoch, {config.epochs} epochs")
    history = []
    for epoch in range(1, config.epochs + 1):
        trained.train()
        loss_sum, seen = 0.0, 0
        epoch_started = time.perf_counter()
        for features, labels in loader:
            features, labels = features.to(process.device), labels.to(process.device)
            with torch.autocast(process.device.type, dtype=torch.bfloat16, enabled=config.bf16):
                loss = F.mse_loss(trained(features).float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(labels)
            seen += len(labels)
        loss_sum, seen, rank_seconds = distributed.sum_over_ranks(
            process, loss_sum, seen, time.perf_counter() - epoch_started)
        train_seconds = rank_seconds / process.world_size  # about equal: the ranks wait for each other every step
        scores = evaluate(model, test_features, test_labels, data.label_stats, process)
        history.append({"epoch": epoch, "train_loss": loss_sum / seen, "train_seconds": train_seconds,
                        "samples_per_second": seen / train_seconds, **scores})
        log(f"epoch {epoch:>3}/{config.epochs}  train loss {loss_sum / seen:.4f}  held-out RMSE "
            f"{scores['test_rmse']:.3f}  MAE {scores['test_mae']:.3f}  (predicting the mean: RMSE "
            f"{scores['baseline_rmse']:.3f})  {time.perf_counter() - started:.1f}s")

    metrics = {
        "world_size": process.world_size,
        "device": process.device.type,
        "train_rows": rows_per_rank * process.world_size,
        "test_rows": history[-1]["test_rows"],
        "epochs": history,
        "final": history[-1],
        "samples_per_second": steady_throughput(history),
        "seconds": round(distributed.max_over_ranks(process, time.perf_counter() - started), 2),
        "staged_data": data.directory,
        "metrics_file": os.path.join(config.output_dir, METRICS_FILE),
    }
    if process.is_main:
        _write_json(metrics["metrics_file"], metrics)
    return metrics


class ShuffledBatches:
    """(features, labels) batches in a new seeded order every epoch, the last one possibly short.

    One random permutation per epoch, sliced into batches, each a single tensor gather. A
    `DataLoader(TensorDataset(...), shuffle=True)` shuffles the same way but reads and collates row by row, which
    made it several times slower than the training steps it fed (see benchmarks/data_path.py).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int):
        self.features, self.labels, self.batch_size = features, labels, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.labels), generator=self.generator)
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            yield self.features[chosen], self.labels[chosen]


def steady_throughput(history: list[dict]) -> float:
    """Training samples per second over all ranks after the first epoch, which pays for warm-up (allocations,
    kernel choices, caches); the first epoch's own figure when there is only one."""
    steady = history[1:] or history
    return sum(epoch["samples_per_second"] * epoch["train_seconds"] for epoch in steady) / sum(
        epoch["train_seconds"] for epoch in steady)


def evaluate(model: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, label_stats: ColumnStats,
             process: distributed.Process) -> dict:
    """Errors in the label's own unit (dollars) over the whole held-out split, all ranks' shares together."""
    model.eval()
    squared, absolute, baseline_squared = 0.0, 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(labels), EVALUATION_BATCH):
            batch = slice(start, start + EVALUATION_BATCH)
            predictions = model(features[batch].to(process.device)).cpu() * label_stats.std + label_stats.mean
            errors = predictions - labels[batch]
            squared += float((errors ** 2).sum())
            absolute += float(errors.abs().sum())
            baseline_squared += float(((labels[batch] - label_stats.mean) ** 2).sum())
    squared, absolute, baseline_squared, count = distributed.sum_over_ranks(
        process, squared, absolute, baseline_squared, len(labels))
    if count == 0:
        raise RuntimeError("the held-out split is empty: train on a larger table")
    return {
        "test_rmse": math.sqrt(squared / count),
        "test_mae": absolute / count,
        "baseline_rmse": math.sqrt(baseline_squared / count),
        "test_rows": int(count),
    }


def _load_split(data: StagedData, directory: str, process: distributed.Process, require_rows: bool):
    """This rank's share of one split: normalised features and raw labels, as tensors."""
    columns = [*data.feature_columns, data.label_column]
    rows = torch.from_numpy(read_shard(directory, columns, process.rank, process.world_size, require_rows))
    means = torch.tensor([stats.mean for stats in data.feature_stats])
    stds = torch.tensor([stats.std for stats in data.feature_stats])
    return (rows[:, :-1] - means) / stds, rows[:, -1].clone()


def _write_json(path: str, content: dict) -> None:
    """Write whole or not at all: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w") as file:
        json.dump(content, file, indent=2)
    os.replace(partial, path)
