"""The training loop, the same on every rank under every launcher (TorchDistributor, DeepSpeed, Ray Train, torchrun).

It knows nothing of Spark, and of the task only its seam (task_interface.py); DDP, FSDP2 or DeepSpeed (the strategy)
makes the updates. A run (`Training`) is a setup, the steps and a finish; after each step the progress report, the
evaluation, the epoch's record and the checkpoint each decide from the optimizer step whether they are due. Every rank
returns the same (all-reduced) metrics, because TorchDistributor keeps the return value of whichever rank ends last."""

import math
import os
import time
from dataclasses import asdict, dataclass
from functools import partial

import torch

from ..config import Config
from ..data.staged import StagedData
from ..files import write_atomically, write_json
from ..run_folder import HF_MODEL_DIR, METRICS_FILE, MODEL_FILE
from ..task_interface import TaskError, check_examples, check_metrics, load_task
from . import ranks, strategy as strategies
from .checkpoints import Checkpoints, complete_steps, named_checkpoint, options_identity
from .throughput import StepMeter
from .tracking import Tracker

EVALUATION_BATCH = 256
NON_FINITE_FIX = "Lower --learning-rate, keep --grad-clip on, or train in fp32 (--precision fp32)"


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite: the run stops before it saves or logs anything of it."""


def train(config: Config, environment: dict[str, str] | None = None) -> dict:
    """Train on this rank's share of the data; the run's metrics (rank 0 also writes OUTPUT_DIR/metrics.json).
    `environment`: what rank 0 needs to reach MLflow (credentials: never written to a file)."""
    process = ranks.start(config.placement.use_gpu, config.collective_timeout)
    try:
        run = Training(config, process, environment or {})
        try:
            run.take_steps()
            metrics = run.finish()
        except BaseException:
            run.tracker.finish(succeeded=False)
            raise
        run.tracker.finish(succeeded=True)
        del run  # DDP's reducer before the process group: gloo (torch 2.13) deadlocks freeing them the other way round
        return metrics
    finally:
        ranks.stop(process)


class Training:
    def __init__(self, config: Config, process: ranks.Process, environment: dict[str, str]):
        self.started, self.config, self.process = time.perf_counter(), config, process
        self.log = log = (lambda *parts: print(*parts, flush=True)) if process.is_main else (lambda *parts: None)
        self.task = task = load_task(config.task)
        self.data = data = StagedData.load(config.staging_dir)
        torch.manual_seed(config.seed)  # the same initial weights on every rank (DDP and DeepSpeed broadcast anyway)

        # This rank's examples; every rank takes the same number of steps, so every share is cut to the smallest.
        train_examples = check_examples(task.examples(data.shard("train", process.rank, process.world_size), data.stats,
                                                      config.task_options), task.__name__)
        self.per_rank = per_rank = ranks.min_over_ranks(process, len(train_examples[0]))
        if per_rank == 0:
            raise ValueError(f"a rank got no training examples from {data.train_dir}: stage a larger table")
        train_examples = tuple(tensor[:per_rank] for tensor in train_examples)
        held_out_rows = data.shard("test", process.rank, process.world_size, require_rows=False)
        self.held_out = check_examples(task.examples(held_out_rows, data.stats, config.task_options), task.__name__)
        self.batches = ShuffledBatches(train_examples, config.batch_size, seed=config.seed + process.rank)
        self.plan = plan = Plan.of(config, len(self.batches), per_rank)

        self.strategy = strategy = strategies.create(config, process)
        # --init-from: a new run starts from an earlier run's checkpoint; a rerun of this run resumes its own instead.
        own = complete_steps(config.checkpoint_dir) if config.resume else []
        source = named_checkpoint(config.init_from) if config.init_from and not own else None

        def build_model() -> torch.nn.Module:  # on the rank that loads the weights, or on the meta device
            model = task.build_model(data.stats, config.task_options)
            if source and config.init_mode == "weights" and torch.get_default_device().type != "meta":
                load_weights(model, strategies.checkpoint_weights(*source), os.path.join(*source))
                log(f"--init-from: the model starts from the weights of {os.path.join(*source)}")
            return model

        model = strategy.build(build_model)
        if config.activation_checkpointing:  # in place, so the weights keep their names
            for block in task.blocks(model):
                block.forward = recomputing(block.forward)
        if config.compile:  # in place, so the weights keep their names (in checkpoints too) whatever wraps the model
            # next. Block by block where the task names its blocks: one block's compiled code serves every block (a
            # fraction of the compiling), and under FSDP2 it runs between the hooks that gather and free its weights.
            for part in task.blocks(model):
                part.compile()
        # Counted on the whole model, before the strategy takes it: ZeRO 3 leaves each rank's parameters empty
        flops = task.flops_per_token(model, config.task_options)
        strategy.prepare(model, lambda model: adamw(model, config.learning_rate, config.weight_decay, config.adam_betas,
                                                    task.parameter_groups(model, config.task_options)),
                         learning_rate_schedule(plan.updates, config.warmup_fraction, config.lr_schedule,
                                                config.min_lr_ratio))
        # (most_batches) in batches of the training micro-batch's size, which fits (a large vocabulary's logits: 256
        # sequences of 512 tokens of Llama 3's would take 67 GB in float32)
        self.held_out_scores = partial(evaluate, task, strategy, self.held_out, data.stats, process,
                                       batch_size=min(config.batch_size, EVALUATION_BATCH))
        # The task's metrics checked on one held-out batch before the first step, not after the first epoch: a forward
        # pass in eval mode, so the weights and the random numbers of training stay as they were.
        self.held_out_scores(most_batches=1)

        # What a checkpoint must share with this run to be resumed from (JSON types: compared after a round trip).
        identity = {**options_identity(config), "source": data.source, "train_rows": data.train_rows,
                    "test_rows": data.test_rows, "world_size": process.world_size}
        self.checkpoints = Checkpoints(config.checkpoint_dir, process, config.keep_checkpoints, identity, log,
                                       (config.checkpoint_every, config.checkpoint_every_steps))
        resumed = self.checkpoints.resume(strategy) if config.resume else None
        if source and config.init_mode == "full":  # that run's progress, but this run's own MLflow run and start
            resumed = {**self.checkpoints.continue_from(strategy, *source), "mlflow_run_id": None, "start": None}
        if resumed:
            strategy.follow_schedule()  # this run's length may differ from the saved run's
        # The model's held-out metrics before its first step (a pretrained model's own: what fine-tuning improves on)
        started_here = not (resumed or {}).get("start")
        self.start = self.held_out_scores() if started_here else resumed["start"]
        self.resumed_from_step = resumed["step"] if resumed else None
        self.step = step = self.resumed_from_step or 0
        self.history, self.epoch_totals = (resumed["history"], resumed.get("epoch_totals")) if resumed else ([], None)
        self.tracker = Tracker(config, process.is_main, environment, log)
        self.run_id = self.tracker.start(params(config, data, process, per_rank, strategy),
                                         resumed.get("mlflow_run_id") if resumed else None)
        self.meter = StepMeter(process, flops, counts_tokens=task.counts_tokens)
        log(f"Training {config.task} with {config.engine} on {process.world_size} {process.device.type.upper()} "
            f"process(es) in {config.precision}: {per_rank} examples per rank, {plan.updates_per_epoch} optimizer "
            f"steps per epoch, {plan.updates} in all ({plan.epochs} epoch(s)); steps {step + 1} to {plan.updates} in "
            "this run.")
        if started_here:
            self.tracker.log_step(step, {"start_held_out_loss": self.start["held_out_loss"]})
            log(f"held-out loss before step {step + 1}: {self.start['held_out_loss']:.4f} (trivial predictor: "
                f"{self.start['baseline_loss']:.4f})")

    def take_steps(self) -> None:
        config, plan, process, strategy, step = self.config, self.plan, self.process, self.strategy, self.step
        while step < plan.updates:
            epoch, first = plan.epoch_of(step), step % plan.updates_per_epoch
            self.epoch_totals = self.epoch_totals if first else None  # a resumed epoch's go on from its checkpoint's
            strategy.model.train()
            waited = time.perf_counter()
            for window in self.batches.windows(epoch, first, plan.updates_per_epoch, config.grad_accumulation):
                window = [strategy.to_device(batch) for batch in window]
                data_seconds, learning_rate = time.perf_counter() - waited, strategy.learning_rate  # this update's
                loss_sum, items, grad_norm = update(self.task, strategy, window, process)
                self.meter.add(loss_sum, items, sum(len(batch[0]) for batch in window), data_seconds)
                step = self.step = step + 1
                self.report_if_due(step, epoch, learning_rate, grad_norm)
                with self.meter.paused():  # evaluations and checkpoints are not training time
                    self.evaluate_if_due(step)
                    self.record_epoch_if_due(step, epoch, learning_rate)
                    self.save_checkpoint_if_due(step, epoch)
                if step == plan.updates:
                    break
                waited = time.perf_counter()

    def report_if_due(self, step: int, epoch: int, learning_rate: float, grad_norm: torch.Tensor | None) -> None:
        if self.config.log_every_steps and step % self.config.log_every_steps == 0:  # the figures since the last one
            figures, part = self.meter.report()
            self.add_to_epoch(part, step)
            figures.update(learning_rate=learning_rate, grad_norm=None if grad_norm is None else float(grad_norm))
            if self.process.device.type == "cuda":
                figures["gpu_memory_gib"] = torch.cuda.max_memory_allocated(self.process.device) / 2 ** 30
            self.tracker.log_step(step, progress_metrics(figures))
            self.log(progress_line(step, self.plan, epoch, figures))

    def evaluate_if_due(self, step: int) -> None:  # on --eval-batches batches a process
        every, batches = self.config.eval_every_steps, self.config.eval_batches
        if every and step % every == 0 and not self.plan.takes_record(step):  # a record evaluates in full anyway
            scores = self.held_out_scores(batches)
            self.tracker.log_step(step, {f"eval_{name}": value for name, value in scores.items()})
            self.log(f"step {step}  held-out loss on {batches} batch(es) a process: {scores['held_out_loss']:.4f}")
            self.strategy.model.train()

    def record_epoch_if_due(self, step: int, epoch: int, learning_rate: float) -> None:  # evaluated in full
        if not self.plan.takes_record(step):
            return
        totals, scores = self.settle(step), self.held_out_scores()
        if not math.isfinite(scores["held_out_loss"]):
            raise NonFiniteLoss(f"the held-out loss became {scores['held_out_loss']} in epoch {epoch}: nothing of this "
                                f"epoch was saved. {NON_FINITE_FIX}")
        if self.history and self.history[-1]["epoch"] == epoch:  # a part of it, an earlier --max-steps' end
            self.history.pop()
        self.history.append(record := {
            "epoch": epoch, "step": step, "train_loss": totals["loss_sum"] / totals["items"],
            "train_seconds": totals["seconds"], "examples_per_second": totals["examples"] / totals["seconds"],
            "learning_rate": learning_rate, **scores})
        self.tracker.log_step(step, epoch_metrics(record, self.plan.ends_epoch(step)))
        self.log(f"epoch {epoch:>3}/{self.plan.epochs}  step {step}/{self.plan.updates}  train loss "
                 f"{record['train_loss']:.4f}  held-out loss {record['held_out_loss']:.4f} "
                 f"(trivial predictor: {record['baseline_loss']:.4f})  {time.perf_counter() - self.started:.1f}s")

    def save_checkpoint_if_due(self, step: int, epoch: int) -> None:
        if self.checkpoints.due(step, self.plan):  # mid-epoch, with the epoch's totals for its record on a resume
            totals = None if self.plan.ends_epoch(step) else self.settle(step)
            self.checkpoints.save(self.strategy, step, {"epoch": epoch, "history": self.history, "start": self.start,
                                                        "mlflow_run_id": self.run_id, "epoch_totals": totals})

    def settle(self, step: int) -> dict | None:  # the epoch's totals up to `step`, for its record or a checkpoint
        if self.meter.updates:
            self.add_to_epoch(self.meter.settle(), step)
        return self.epoch_totals

    def add_to_epoch(self, part: dict, step: int) -> None:
        if part["updates"] and not math.isfinite(part["loss_sum"]):
            raise NonFiniteLoss(f"the training loss became {part['loss_sum']} by step {step}: no checkpoint of it "
                                f"was saved. {NON_FINITE_FIX}")
        totals = self.epoch_totals or dict.fromkeys(("loss_sum", "items", "examples", "seconds"), 0.0)
        self.epoch_totals = {name: total + part[name] for name, total in totals.items()}  # JSON numbers: in checkpoints

    def finish(self) -> dict:
        config, process, history, step = self.config, self.process, self.history, self.step
        if not history:  # a resumed run whose budget was already spent: its last checkpoint's record stands
            raise ValueError(f"--max-steps {config.max_steps} is below the {step} steps the run in "
                             f"{config.output_dir} took already: give a larger --max-steps, or a new --output-dir")
        metrics = {"task": config.task, "engine": config.engine, "world_size": process.world_size,
            "device": process.device.type, "precision": config.precision,
            "train_examples": self.per_rank * process.world_size, "held_out_loss": history[-1]["held_out_loss"],
            "baseline_loss": history[-1]["baseline_loss"], "start_held_out_loss": self.start["held_out_loss"],
            "final": history[-1], "epochs": history, "step": step,
            "updates_per_epoch": self.plan.updates_per_epoch, "max_steps": config.max_steps,
            "resumed_from_step": self.resumed_from_step,
            **self.meter.totals(),  # examples_per_second, tokens_per_second, mfu
            "seconds": round(ranks.max_over_ranks(process, time.perf_counter() - self.started), 2),
            "staged_data": self.data.directory, "metrics_file": os.path.join(config.output_dir, METRICS_FILE),
            "mlflow_run_id": self.run_id, "job_run_id": config.job_run_id, "init_from": config.init_from}
        weights = self.strategy.full_state_dict()  # a collective under ZeRO 3: every rank takes part
        if process.is_main:  # the models before the metrics: a run with metrics.json is finished, its models there
            write_atomically(os.path.join(config.output_dir, MODEL_FILE), lambda file: torch.save(weights, file))
            trained = self.task.build_model(self.data.stats, config.task_options)
            trained.load_state_dict(weights)
            self.task.save_pretrained(trained, os.path.join(config.output_dir, HF_MODEL_DIR), config.task_options)
            write_json(metrics["metrics_file"], metrics)
            self.tracker.log_file(metrics["metrics_file"])
            self.tracker.log_model(*self.task.exported_model(trained.eval(), self.data.stats, self.held_out))
        return metrics


@dataclass(frozen=True)
class Plan:
    """The run's length in optimizer steps (updates): its epochs, cut by --max-steps. An epoch ends on an update."""

    epochs: int
    updates_per_epoch: int
    updates: int  # the whole run's: the learning-rate schedule spans it

    @classmethod
    def of(cls, config: Config, micro_batches: int, per_rank: int) -> "Plan":
        updates_per_epoch = micro_batches // config.grad_accumulation
        if updates_per_epoch == 0:
            raise ValueError(f"{per_rank} examples per rank make {micro_batches} batch(es) of {config.batch_size}, "
                             f"fewer than one accumulation window of {config.grad_accumulation}: lower --batch-size "
                             "or --grad-accumulation")
        updates = min(config.epochs * updates_per_epoch, config.max_steps or math.inf)
        return cls(math.ceil(updates / updates_per_epoch), updates_per_epoch, updates)

    def epoch_of(self, step: int) -> int:  # the epoch (from 1) that the update after `step` updates belongs to
        return step // self.updates_per_epoch + 1

    def ends_epoch(self, step: int) -> bool:  # whether the update that made `step` updates was its epoch's last
        return step % self.updates_per_epoch == 0

    def takes_record(self, step: int) -> bool:  # an epoch's record: where it ends, or where the run does
        return self.ends_epoch(step) or step == self.updates


def update(task, strategy, window: list[tuple], process: ranks.Process):
    """One optimizer update from a window's micro-batches (on the device): (this rank's loss summed over its items, the
    window's items over every rank, the gradients' norm). Each micro-batch's mean loss is weighed by its share of the
    window's items on every rank (the task's `count`, else examples), times the ranks that DDP and DeepSpeed average."""
    counts = _counts(task, window, process.device)
    total = counts.sum()  # of examples, every rank has as many in its window: no need to ask the others
    total = ranks.sum_tensor_over_ranks(process, total) if task.counts_tokens else total * process.world_size
    loss_sum = torch.zeros((), dtype=torch.float64, device=process.device)
    for index, batch in enumerate(window):
        with strategy.micro_batch(last=index == len(window) - 1):
            with strategy.autocast():
                loss = task.loss(strategy.model, batch)
            strategy.backward(loss * (counts[index] * process.world_size / total).to(loss.dtype))
        loss_sum += loss.detach().double() * counts[index]
    return loss_sum, total, strategy.step()


def _counts(task, window: list[tuple], device: torch.device) -> torch.Tensor:
    """What each micro-batch's loss is the mean over, on the device (one copy for the window when they are numbers)."""
    counted = [task.count(batch) for batch in window]
    if all(isinstance(count, int) for count in counted):
        return torch.tensor(counted, dtype=torch.float64).to(device, non_blocking=True)
    return torch.stack([torch.as_tensor(count, dtype=torch.float64, device=device) for count in counted])


def recomputing(forward):
    """Activation checkpointing: a forward that keeps only its inputs for the backward pass, which runs it again."""
    # A Python function, not a functools.partial: torch.compile traces into the one and would skip the other.
    return lambda *inputs, **options: torch.utils.checkpoint.checkpoint(forward, *inputs, use_reentrant=False,
                                                                         **options)


STEP_METRICS = ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "examples_per_second", "mfu",
                "step_seconds", "data_wait_share", "gpu_memory_gib")


def progress_metrics(figures: dict) -> dict:
    """What MLflow records of a report window (nothing that is unknown here, such as MFU on CPU)."""
    return {name: figures[name] for name in STEP_METRICS if figures.get(name) is not None}


def epoch_metrics(record: dict, ended: bool) -> dict:
    """MLflow's names of an epoch's record: a step report's own names with `epoch_`; `epoch` once the epoch ended."""
    return {f"epoch_{name}" if name in STEP_METRICS else name: value for name, value in record.items()
            if ended or name != "epoch"}


def progress_line(step: int, plan: Plan, epoch: int, figures: dict) -> str:
    parts = [f"step {step:>{len(str(plan.updates))}}/{plan.updates}", f"epoch {epoch}",
             f"loss {figures['train_loss']:.4f}", f"lr {figures['learning_rate']:.2e}"]
    parts += [f"grad norm {figures['grad_norm']:.3f}"] if figures["grad_norm"] is not None else []
    parts.append(f"{figures['tokens_per_second']:,.0f} tokens/s" if figures["tokens_per_second"] is not None else
                 f"{figures['examples_per_second']:,.0f} examples/s")
    parts += [f"MFU {figures['mfu']:.1%}"] if figures["mfu"] is not None else []
    parts.append(f"{figures['step_seconds'] * 1000:,.0f} ms a step ({figures['data_wait_share']:.1%} waiting for data)")
    parts += [f"peak GPU memory {figures['gpu_memory_gib']:.1f} GiB"] if "gpu_memory_gib" in figures else []
    minutes, seconds = divmod(round((plan.updates - step) * figures["step_seconds"]), 60)
    return "  ".join([*parts, f"{minutes // 60}:{minutes % 60:02}:{seconds:02} left"])


def load_weights(model: torch.nn.Module, weights: dict, source: str) -> None:
    own = model.state_dict()  # a checkpoint holds no frozen parameter: build_model made them (strategy.frozen)
    missing, unexpected = sorted(set(own) - set(weights) - strategies.frozen(model)), sorted(set(weights) - set(own))
    reshaped = sorted(name for name in set(own) & set(weights) if own[name].shape != weights[name].shape)
    if missing or unexpected or reshaped:
        found = "; ".join(f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for what, names in
                          (("missing", missing), ("unexpected", unexpected), ("other shapes", reshaped)) if names)
        raise ValueError(f"--init-from {source}: its weights do not fit this run's model ({found}): start from a run "
                         "of the same task and model options")
    model.load_state_dict(weights, strict=False)


def adamw(model: torch.nn.Module, learning_rate: float, weight_decay: float, betas: tuple[float, float],
          groups: list[dict] | None = None) -> torch.optim.Optimizer:
    """AdamW over the task's parameter groups (task_interface.LoadedTask.parameter_groups; None: one of every trainable
    parameter), each at its lr_scale times the rate, with weight decay on the weight matrices only (not on biases,
    norms' gains or 1-d parameters)."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    groups = groups or [{"params": trainable}]
    if left_out := len({id(p) for p in trainable} - {id(p) for group in groups for p in group["params"]}):
        raise TaskError(f"the task's parameter_groups leave {left_out} trainable parameter(s) of the model out, which "
                        "would never train: put each in a group, or freeze it (requires_grad False)")
    split = [{"params": [p for p in group["params"] if p.requires_grad and (p.dim() >= 2) == decays],
              "weight_decay": weight_decay if decays else 0.0, "lr_scale": group.get("lr_scale", 1.0),
              "lr": learning_rate * group.get("lr_scale", 1.0)} for group in groups for decays in (True, False)]
    return torch.optim.AdamW([group for group in split if group["params"]], lr=learning_rate, betas=betas)


def learning_rate_schedule(updates: int, warmup_fraction: float, shape: str, floor: float):
    """The learning rate's multiplier for the update after `step` updates: a linear warm-up whose last update has the
    peak rate, then by `shape` (config.LR_SCHEDULES) a cosine or linear decay whose last update (the run's:
    `updates - 1`) has the `floor`, or the peak to the end (constant). Never above 1."""
    warmup = int(updates * warmup_fraction)

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if shape == "constant":
            return 1.0
        decay = updates - 1 - warmup  # updates after the first of the decay
        progress = min((step - warmup) / decay, 1.0) if decay > 0 else 1.0
        left = 0.5 * (1 + math.cos(math.pi * progress)) if shape == "cosine" else 1 - progress  # of the fall to come
        return floor + (1 - floor) * left

    return multiplier


class ShuffledBatches:
    """Batches of examples (tensors sliced together, one gather each) in an order that depends on the seed and the
    epoch alone (`set_epoch`): a resumed run sees the batches an uninterrupted one would have, mid-epoch too."""

    def __init__(self, examples: tuple, batch_size: int, seed: int):
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + 1_000_003 * epoch)  # a prime stride: (rank, epoch) pairs never meet

    def __len__(self) -> int:
        return math.ceil(len(self.examples[0]) / self.batch_size)

    def __iter__(self):
        return self.batches(0, len(self))

    def batches(self, first: int, end: int):
        # int32: half the memory of the default int64, the same order (a rank's memory hardly grows with its data)
        order = torch.randperm(len(self.examples[0]), generator=self.generator, dtype=torch.int32)
        for start in range(first * self.batch_size, min(end * self.batch_size, len(order)), self.batch_size):
            chosen = order[start:start + self.batch_size]
            yield tuple(tensor[chosen] for tensor in self.examples)

    def windows(self, epoch: int, first_update: int, updates: int, size: int):
        """Epoch `epoch`'s accumulation windows (lists of `size` batches) from update `first_update` to `updates`."""
        self.set_epoch(epoch)
        window = []
        for batch in self.batches(first_update * size, updates * size):
            window.append(batch)
            if len(window) == size:
                yield window
                window = []


def evaluate(task, strategy, held_out: tuple, stats: dict, process: ranks.Process,
             most_batches: int | None = None, batch_size: int = EVALUATION_BATCH) -> dict:
    """The task's held-out metrics over every rank's share (its first `most_batches` batches, where given). Every rank
    runs as many forward passes (ZeRO 3 gathers weights in each): one whose share is done repeats a batch, ignored."""
    rows = len(held_out[0]) if most_batches is None else min(len(held_out[0]), most_batches * batch_size)
    batches = ranks.max_over_ranks(process, math.ceil(rows / batch_size))
    model, sums = strategy.inference_model, {}
    model.eval()
    with torch.no_grad():
        for index in range(int(batches)):
            start = index * batch_size
            counted = start < rows
            part_rows = slice(start, min(start + batch_size, rows)) if counted else slice(0, 1)
            with strategy.autocast():
                part = task.evaluate(model, strategy.to_device(tuple(tensor[part_rows] for tensor in held_out)), stats)
            for name, value in part.items():
                sums[name] = sums.get(name, 0.0) + (float(value) if counted else 0.0)
    return check_metrics(task.summarize(ranks.sum_dict_over_ranks(process, sums), stats), task.__name__)


def params(config: Config, data: StagedData, process: ranks.Process, per_rank: int, strategy) -> dict:
    options = ("epochs", "max_steps", "batch_size", "grad_accumulation", "learning_rate", "weight_decay", "adam_betas",
               "warmup_fraction", "lr_schedule", "min_lr_ratio", "grad_clip", "seed", "compile",
               "activation_checkpointing", "parallelism")
    return {"task": config.task, "engine": config.engine, "source": data.source, "output_dir": config.output_dir,
            "train_examples": per_rank * process.world_size, "test_rows": data.test_rows,
            "world_size": process.world_size, "device": process.device.type, "precision": config.precision,
            **{name: getattr(config, name) for name in options},
            **{f"task.{name}": value for name, value in asdict(config.task_options).items()},
            **({"init_from": config.init_from, "init_mode": config.init_mode} if config.init_from else {}),
            **strategy.params}

