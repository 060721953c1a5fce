"""The training loop, the same on every rank under every launcher (TorchDistributor, DeepSpeed, Ray Train, torchrun).

It knows nothing of Spark and nothing of the task beyond its seam (task_interface.py): it reads this rank's share of
the staged files, asks the task for examples, a model and a loss, and owns the rest: AdamW, a learning-rate warm-up
then cosine decay, gradient clipping, mixed precision, evaluation on the held-out split after every epoch, the
checkpoint after every epoch (a rerun resumes from the newest complete one), and MLflow from rank 0. Whether DDP or
DeepSpeed makes the updates is the strategy's business; the loop reads the same under either.

`train(config)` is what the launchers run: a module-level function of one picklable argument. Every rank returns the
same metrics (they are all-reduced), because TorchDistributor keeps the return value of whichever rank ends last.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict

import torch

from ..config import Config, placement
from ..files import write_json
from ..task_interface import check_metrics, load_task
from . import distributed, strategy as strategies
from .checkpoints import Checkpoints, complete_epochs, named_checkpoint
from .data import StagedData, read_shard
from .deepspeed_config import deepspeed_config, offload_of
from .tracking import Tracker

METRICS_FILE = "metrics.json"
EVALUATION_BATCH = 256


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite: the run stops before it saves or logs anything of it."""


def train(config: Config, environment: dict[str, str] | None = None) -> dict:
    """Train on this rank's share of the data; the run's metrics (rank 0 also writes OUTPUT_DIR/metrics.json).
    `environment`: what rank 0 needs to reach MLflow (credentials: never written to a file)."""
    process = distributed.start(placement(config).use_gpu, config.collective_timeout)
    try:
        return _train(config, process, environment or {})
    finally:
        distributed.stop(process)


def _train(config: Config, process: distributed.Process, environment: dict[str, str]) -> dict:
    started = time.perf_counter()
    log = (lambda *parts: print(*parts, flush=True)) if process.is_main else (lambda *parts: None)
    task, options = load_task(config.task), config.task_options
    data = StagedData.load(config.staging_dir)
    torch.manual_seed(config.seed)  # the same initial weights on every rank (DDP and DeepSpeed broadcast anyway)

    # This rank's examples; every rank takes the same number of steps, so every share is cut to the smallest.
    train_examples = task.examples(read_shard(data.train_dir, process.rank, process.world_size), data.stats, options)
    per_rank = distributed.min_over_ranks(process, len(train_examples[0]))
    if per_rank == 0:
        raise ValueError(f"a rank got no training examples from {data.train_dir}: stage a larger table")
    train_examples = tuple(tensor[:per_rank] for tensor in train_examples)
    held_out = task.examples(read_shard(data.test_dir, process.rank, process.world_size, require_rows=False),
                             data.stats, options)
    batches = ShuffledBatches(train_examples, config.batch_size, seed=config.seed + process.rank)
    steps_per_epoch = len(batches) - len(batches) % config.grad_accumulation  # an epoch ends on an update
    examples_per_epoch = min(steps_per_epoch * config.batch_size, per_rank)  # the last batch may be short
    if steps_per_epoch == 0:
        raise ValueError(f"{per_rank} examples per rank make {len(batches)} batch(es) of {config.batch_size}, fewer "
                         f"than one accumulation window of {config.grad_accumulation}: lower --batch-size or "
                         "--grad-accumulation")
    updates = config.epochs * steps_per_epoch // config.grad_accumulation

    strategy = strategies.create(config, process)
    model = task.build_model(data.stats, options)
    # --init-from: a new run starts from an earlier run's checkpoint; a rerun of this run resumes its own instead.
    own = complete_epochs(config.checkpoint_dir) if config.resume else []
    source = named_checkpoint(config.init_from) if config.init_from and not own else None
    if source and config.init_mode == "weights":
        load_weights(model, strategies.checkpoint_weights(*source), os.path.join(*source))
        log(f"--init-from: the model starts from the weights of {os.path.join(*source)}")
    strategy.prepare(model, lambda model: adamw(model, config.learning_rate, config.weight_decay),
                     warmup_then_cosine(updates, config.warmup_fraction))
    checkpoints = Checkpoints(config.checkpoint_dir, process, config.keep_checkpoints, run_identity(config, data,
                              process), log)
    resumed = checkpoints.resume(strategy) if config.resume else None
    if source and config.init_mode == "full":  # that run's progress, but this run's own MLflow run
        resumed = {**checkpoints.continue_from(strategy, *source), "mlflow_run_id": None}
    history = resumed["history"] if resumed else []
    tracker = Tracker(config, process.is_main, environment, log)
    run_id = tracker.start(params(config, data, process, per_rank), resumed.get("mlflow_run_id") if resumed else None)

    first_epoch = resumed["epoch"] + 1 if resumed else 1
    log(f"training {config.task_name} on {process.world_size} process(es), {process.device.type}, {config.engine}, "
        f"{config.precision}: {per_rank} examples per rank, {steps_per_epoch} steps of {config.batch_size} per epoch"
        f"{f' (an update every {config.grad_accumulation})' if config.grad_accumulation > 1 else ''}, "
        f"epochs {first_epoch}..{config.epochs}")
    try:
        for epoch in range(first_epoch, config.epochs + 1):
            strategy.model.train()
            batches.set_epoch(epoch)
            loss_sum = torch.zeros((), device=process.device)  # added up on the device: no sync per step
            epoch_started = time.perf_counter()
            for _, batch in zip(range(steps_per_epoch), batches):
                batch = strategy.to_device(batch)
                with strategy.autocast():
                    loss = task.loss(strategy.model, batch)
                strategy.backward(loss)
                strategy.step()
                loss_sum += loss.detach()
            loss_sum, seconds = distributed.sum_over_ranks(process, float(loss_sum), time.perf_counter() - epoch_started)
            train_loss, seconds = loss_sum / (steps_per_epoch * process.world_size), seconds / process.world_size
            scores = evaluate(task, strategy, held_out, data.stats, process)
            if not (math.isfinite(train_loss) and math.isfinite(scores["held_out_loss"])):
                raise NonFiniteLoss(f"the loss became {train_loss} in epoch {epoch} (held-out "
                                    f"{scores['held_out_loss']}): nothing of this epoch was saved. Lower "
                                    "--learning-rate, keep --grad-clip on, or train in fp32 (--precision fp32)")
            history.append({"epoch": epoch, "train_loss": train_loss, "train_seconds": seconds,
                             "examples_per_second": examples_per_epoch * process.world_size / seconds,
                             "learning_rate": strategy.scheduler.get_last_lr()[0], **scores})
            tracker.log_epoch(epoch, history[-1])
            log(f"epoch {epoch:>3}/{config.epochs}  train loss {train_loss:.4f}  held-out loss "
                f"{scores['held_out_loss']:.4f} (trivial predictor: {scores['baseline_loss']:.4f})  "
                f"{time.perf_counter() - started:.1f}s")
            if epoch % config.checkpoint_every == 0 or epoch == config.epochs:
                checkpoints.save(strategy, epoch, {"history": history, "mlflow_run_id": run_id})

        metrics = {
            "task": config.task, "engine": config.engine, "world_size": process.world_size,
            "device": process.device.type, "precision": config.precision,
            "train_examples": per_rank * process.world_size, "held_out_loss": history[-1]["held_out_loss"],
            "baseline_loss": history[-1]["baseline_loss"], "final": history[-1], "epochs": history,
            "resumed_from_epoch": resumed["epoch"] if resumed else None,
            "examples_per_second": steady_throughput(history),
            "seconds": round(distributed.max_over_ranks(process, time.perf_counter() - started), 2),
            "staged_data": data.directory, "metrics_file": os.path.join(config.output_dir, METRICS_FILE),
            "mlflow_run_id": run_id, "job_run_id": config.job_run_id, "init_from": config.init_from,
        }
        weights = strategy.full_state_dict()  # a collective under ZeRO 3: every rank takes part
        if process.is_main:
            write_json(metrics["metrics_file"], metrics)
            tracker.log_file(metrics["metrics_file"])
            trained = task.build_model(data.stats, options)
            trained.load_state_dict(weights)
            tracker.log_model(*task.exported_model(trained.eval(), data.stats, held_out))
    except BaseException:
        tracker.finish(succeeded=False)
        raise
    tracker.finish(succeeded=True)
    return metrics


def load_weights(model: torch.nn.Module, weights: dict, source: str) -> None:
    """An earlier run's weights into this run's model: every parameter and buffer, with the same shapes."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    reshaped = sorted(name for name in set(own) & set(weights) if own[name].shape != weights[name].shape)
    if missing or unexpected or reshaped:
        found = "; ".join(f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for what, names in
                          (("missing", missing), ("unexpected", unexpected), ("other shapes", reshaped)) if names)
        raise ValueError(f"--init-from {source}: its weights do not fit this run's model ({found}): start from a run "
                         "of the same task and model options")
    model.load_state_dict(weights)


def adamw(model: torch.nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on the weight matrices only (not on biases, norms' gains or 1-d parameters)."""
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    groups = [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([group for group in groups if group["params"]], lr=learning_rate, betas=(0.9, 0.95))


def warmup_then_cosine(updates: int, warmup_fraction: float, floor: float = 0.1):
    """The learning rate's multiplier after `step` updates: linear warm-up, then a cosine decay to `floor`."""
    warmup = int(updates * warmup_fraction)

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(updates - warmup, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


class ShuffledBatches:
    """Batches of examples (a tuple of tensors sliced together) in a new seeded order every epoch.

    After `set_epoch(epoch)` the order depends on the seed and the epoch alone, so a run resumed at any epoch sees the
    batches an uninterrupted run would have seen. Each batch is one gather per tensor: a DataLoader over a
    TensorDataset reads and collates example by example, several times slower than the steps it feeds.
    """

    def __init__(self, examples: tuple, batch_size: int, seed: int):
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + 1_000_003 * epoch)  # a prime stride: (rank, epoch) pairs never meet

    def __len__(self) -> int:
        return math.ceil(len(self.examples[0]) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.examples[0]), generator=self.generator)
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            yield tuple(tensor[chosen] for tensor in self.examples)


def evaluate(task, strategy, held_out: tuple, stats: dict, process: distributed.Process) -> dict:
    """The task's held-out metrics over every rank's share. Every rank runs the same number of forward passes (ZeRO 3
    gathers the weights in each): a rank whose share is done repeats its first batch and ignores it."""
    rows = len(held_out[0])
    batches = distributed.max_over_ranks(process, math.ceil(rows / EVALUATION_BATCH))
    model, sums = strategy.inference_model, {}
    model.eval()
    with torch.no_grad():
        for index in range(int(batches)):
            start = index * EVALUATION_BATCH
            counted = start < rows
            part_rows = slice(start, start + EVALUATION_BATCH) if counted else slice(0, 1)
            with strategy.autocast():
                part = task.evaluate(model, strategy.to_device(tuple(tensor[part_rows] for tensor in held_out)), stats)
            for name, value in part.items():
                sums[name] = sums.get(name, 0.0) + (float(value) if counted else 0.0)
    totals = distributed.sum_dict_over_ranks(process, sums)
    return check_metrics(task.summarize(totals, stats), task.__name__)


def steady_throughput(history: list[dict]) -> float:
    """Examples per second over all ranks after the first epoch, which pays for warm-up (allocations, kernel
    choices, caches); the first epoch's own figure when there is only one."""
    steady = history[1:] or history
    return sum(epoch["examples_per_second"] * epoch["train_seconds"] for epoch in steady) / sum(
        epoch["train_seconds"] for epoch in steady)


def run_identity(config: Config, data: StagedData, process: distributed.Process) -> dict:
    """What a checkpoint must share with this run to be resumed from (JSON types: compared after a round trip)."""
    return {"task": config.task, "task_options": _json(asdict(config.task_options)), "engine": config.engine,
            "source": data.source, "train_rows": data.train_rows, "test_rows": data.test_rows,
            "world_size": process.world_size, "seed": config.seed, "batch_size": config.batch_size,
            "grad_accumulation": config.grad_accumulation}


def params(config: Config, data: StagedData, process: distributed.Process, per_rank: int) -> dict:
    """What MLflow records of the run."""
    recorded = {"task": config.task, "engine": config.engine, "source": data.source,
                "train_examples": per_rank * process.world_size, "test_rows": data.test_rows,
                "world_size": process.world_size, "device": process.device.type, "precision": config.precision,
                **{name: getattr(config, name) for name in ("epochs", "batch_size", "grad_accumulation",
                                                            "learning_rate", "weight_decay", "warmup_fraction",
                                                            "grad_clip", "seed")},
                **{f"task.{name}": value for name, value in asdict(config.task_options).items()},
                **({"init_from": config.init_from, "init_mode": config.init_mode} if config.init_from else {})}
    if config.engine == "deepspeed":
        zero = deepspeed_config(config, process.world_size, config.precision)["zero_optimization"]
        recorded.update(zero_stage=zero["stage"], offload=offload_of(zero))
    return recorded


def _json(value):
    """Tuples as lists, as they read back from JSON."""
    if isinstance(value, (tuple, list)):
        return [_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _json(item) for key, item in value.items()}
    return value
