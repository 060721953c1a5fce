"""The training loop, the same on every rank under every launcher (TorchDistributor, DeepSpeed, Ray Train, torchrun).

It knows nothing of Spark: it reads this rank's share of the staged parquet files, trains the fare model, and
evaluates on the held-out split after every epoch. Quality is stated against the simplest possible model, predicting
the training mean, so a number means something. Whether DDP or DeepSpeed makes the updates is the strategy's business
(`strategy`); the loop reads the same under either. After every epoch (or every `checkpoint_every`) the state is
checkpointed, and a rerun resumes from the newest complete checkpoint (`checkpoints`). Rank 0 logs to MLflow
(`tracking`) and prints one line per epoch.

`train` is what the launchers run: a module-level function of one picklable argument. Every rank returns the same
metrics (they are all-reduced), because TorchDistributor keeps the return value of whichever rank finishes last.
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F

from . import distributed
from . import strategy as strategies
from .checkpoints import Checkpoints, write_json
from .config import TrainingConfig
from .model import FarePredictor, FareRegressor
from .staged import ColumnStats, StagedData, read_shard
from .tracking import Tracker

METRICS_FILE = "metrics.json"
EVALUATION_BATCH = 8192
MODEL_EXAMPLE_ROWS = 5


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
    log = (lambda *parts: print(*parts, flush=True)) if process.is_main else (lambda *parts: None)
    torch.manual_seed(config.seed)  # the same initial weights everywhere (DDP and DeepSpeed broadcast rank 0's anyway)

    feature_means = torch.tensor([stats.mean for stats in data.feature_stats])
    feature_stds = torch.tensor([stats.std for stats in data.feature_stats])
    train_features, train_labels = _load_split(data, data.train_dir, process, require_rows=True)
    # Every rank must take the same number of steps: cut every share to the smallest one.
    rows_per_rank = distributed.min_over_ranks(process, len(train_labels))
    if rows_per_rank == 0:
        raise RuntimeError(f"a rank got no training rows from {data.train_dir}: stage the data again")
    train_features, train_labels = train_features[:rows_per_rank], train_labels[:rows_per_rank]
    test_features, test_labels = _load_split(data, data.test_dir, process, require_rows=False)
    normalise = lambda features: (features - feature_means) / feature_stds  # noqa: E731
    normalised_train_labels = (train_labels - data.label_stats.mean) / data.label_stats.std

    loader = ShuffledBatches(normalise(train_features), normalised_train_labels, config.batch_size,
                             config.seed + process.rank)
    # An epoch ends on an optimizer step, so a checkpoint never holds half an accumulation window.
    steps_per_epoch = len(loader) - len(loader) % config.grad_accumulation
    if steps_per_epoch == 0:
        raise ValueError(
            f"{rows_per_rank} training rows per rank make {len(loader)} batch(es) of {config.batch_size}, fewer than "
            f"one accumulation window of {config.grad_accumulation}: lower --batch-size or --grad-accumulation"
        )
    strategy = strategies.create(config.strategy, process, config.learning_rate, config.grad_accumulation,
                                 config.precision, config.deepspeed_config)
    strategy.prepare(FareRegressor(len(data.feature_columns), config.hidden_sizes))

    checkpoints = Checkpoints(config.checkpoints, process, config.keep_checkpoints, _run_identity(config, process),
                              log)
    resumed = checkpoints.resume(strategy) if config.resume else None
    history = resumed["history"] if resumed else []
    tracker = Tracker(config.tracking, process.is_main, log)
    run_id = tracker.start(_params(config, process, rows_per_rank), resumed.get("mlflow_run_id") if resumed else None)
    if config.deepspeed_config and not resumed:
        tracker.log_dict(config.deepspeed_config, "deepspeed_config.json")

    first_epoch = resumed["epoch"] + 1 if resumed else 1
    log(f"training on {process.world_size} process(es), {process.device.type}, {config.strategy}, {config.precision}: "
        f"{rows_per_rank} rows per rank, {steps_per_epoch} steps of {config.batch_size} per epoch"
        f"{f' (an update every {config.grad_accumulation})' if config.grad_accumulation > 1 else ''}, "
        f"epochs {first_epoch}..{config.epochs}")
    try:
        for epoch in range(first_epoch, config.epochs + 1):
            strategy.model.train()
            loader.set_epoch(epoch)
            loss_sum, seen = 0.0, 0
            epoch_started = time.perf_counter()
            for _, (features, labels) in zip(range(steps_per_epoch), loader):
                labels = labels.to(process.device, non_blocking=True)
                with strategy.autocast():
                    loss = F.mse_loss(strategy.model(strategy.inputs(features)).float(), labels)
                strategy.backward(loss)
                strategy.step()
                loss_sum += loss.item() * len(labels)
                seen += len(labels)
            loss_sum, seen, rank_seconds = distributed.sum_over_ranks(
                process, loss_sum, seen, time.perf_counter() - epoch_started)
            train_seconds = rank_seconds / process.world_size  # about equal: the ranks wait for each other every step
            scores = evaluate(strategy.predict, normalise(test_features), test_labels, data.label_stats, process)
            history.append({"epoch": epoch, "train_loss": loss_sum / seen, "train_seconds": train_seconds,
                            "samples_per_second": seen / train_seconds, **scores})
            tracker.log_epoch(epoch, history[-1])
            log(f"epoch {epoch:>3}/{config.epochs}  train loss {loss_sum / seen:.4f}  held-out RMSE "
                f"{scores['test_rmse']:.3f}  MAE {scores['test_mae']:.3f}  (predicting the mean: RMSE "
                f"{scores['baseline_rmse']:.3f})  {time.perf_counter() - started:.1f}s")
            if epoch % config.checkpoint_every == 0 or epoch == config.epochs:
                checkpoints.save(strategy, epoch, {"history": history, "mlflow_run_id": run_id})

        metrics = {
            "world_size": process.world_size,
            "device": process.device.type,
            "strategy": config.strategy,
            "precision": config.precision,
            "train_rows": rows_per_rank * process.world_size,
            "test_rows": history[-1]["test_rows"],
            "epochs": history,
            "final": history[-1],
            "resumed_from_epoch": resumed["epoch"] if resumed else None,
            "samples_per_second": steady_throughput(history),
            "seconds": round(distributed.max_over_ranks(process, time.perf_counter() - started), 2),
            "staged_data": data.directory,
            "metrics_file": os.path.join(config.output_dir, METRICS_FILE),
            "mlflow_run_id": run_id,
        }
        weights = strategy.full_state_dict()  # a collective under ZeRO 3: every rank takes part
        if process.is_main:
            write_json(metrics["metrics_file"], metrics)
            tracker.log_file(metrics["metrics_file"])
            predictor = _predictor(config, weights)
            tracker.log_model(predictor, test_features[:MODEL_EXAMPLE_ROWS].numpy())
    except BaseException:
        tracker.finish(succeeded=False)
        raise
    tracker.finish(succeeded=True)
    return metrics


class ShuffledBatches:
    """(features, labels) batches in a new seeded order every epoch, the last one possibly short.

    After `set_epoch(epoch)` the order depends on the seed and the epoch alone, so a run resumed at any epoch sees
    the batches an uninterrupted run would have seen.

    One random permutation per epoch, sliced into batches, each a single tensor gather. A
    `DataLoader(TensorDataset(...), shuffle=True)` shuffles the same way but reads and collates row by row, which
    made it several times slower than the training steps it fed (see benchmarks/data_path.py).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int):
        self.features, self.labels, self.batch_size, self.seed = features, labels, batch_size, seed
        self.generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + 1_000_003 * epoch)  # a prime stride: (rank, epoch) pairs never meet

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


def evaluate(predict, features: torch.Tensor, labels: torch.Tensor, label_stats: ColumnStats,
             process: distributed.Process) -> dict:
    """Errors in the label's own unit (dollars) over the whole held-out split, all ranks' shares together.

    `predict` maps normalised features to normalised predictions, float32 on the CPU (a strategy's `predict`)."""
    squared, absolute, baseline_squared = 0.0, 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(labels), EVALUATION_BATCH):
            batch = slice(start, start + EVALUATION_BATCH)
            predictions = predict(features[batch]) * label_stats.std + label_stats.mean
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
    """This rank's share of one split: raw features and labels, as tensors."""
    columns = [*data.feature_columns, data.label_column]
    rows = torch.from_numpy(read_shard(directory, columns, process.rank, process.world_size, require_rows))
    return rows[:, :-1], rows[:, -1].clone()


def _run_identity(config: TrainingConfig, process: distributed.Process) -> dict:
    """What a checkpoint must share with this run to be resumed from (JSON types: it is compared after a round trip)."""
    data = config.data
    return {"source": data.source, "train_rows": data.train_rows, "test_rows": data.test_rows,
            "world_size": process.world_size, "strategy": config.strategy, "seed": config.seed,
            "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation,
            "hidden_sizes": list(config.hidden_sizes)}


def _params(config: TrainingConfig, process: distributed.Process, rows_per_rank: int) -> dict:
    params = {
        "source": config.data.source, "train_rows": rows_per_rank * process.world_size,
        "test_rows": config.data.test_rows, "world_size": process.world_size,
        "device": process.device.type, "strategy": config.strategy, "precision": config.precision,
        "epochs": config.epochs, "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation,
        "learning_rate": config.learning_rate, "seed": config.seed,
        "hidden_sizes": ",".join(map(str, config.hidden_sizes)),
    }
    if config.deepspeed_config:
        zero = config.deepspeed_config.get("zero_optimization", {})
        params["zero_stage"] = zero.get("stage", 0)
        params["offload"] = "+".join(part.removeprefix("offload_") for part in ("offload_optimizer", "offload_param")
                                     if part in zero) or "none"
    return params


def _predictor(config: TrainingConfig, weights: dict) -> FarePredictor:
    """The trained model with its normalisation, on the CPU: what MLflow records."""
    data = config.data
    regressor = FareRegressor(len(data.feature_columns), config.hidden_sizes)
    regressor.load_state_dict(weights)
    return FarePredictor(regressor, [stats.mean for stats in data.feature_stats],
                         [stats.std for stats in data.feature_stats], data.label_stats.mean,
                         data.label_stats.std).eval()
