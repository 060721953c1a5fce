"""What one `train` run is asked to do, every default defined here once: read from the command line (`from_args`),
checked before Spark (`check`), resolved on the driver (`resolve`), pickled to every rank (torchrun: JSON)."""

import argparse
import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .compute.requirements import (DEEPSPEED as DEEPSPEED_ENGINE, ENGINES, SPARK_ML_CONNECT as SPARK_ML_ENGINE,
                                   TORCH_DISTRIBUTOR)
from .task_interface import TaskError, load_task

PACKAGE = __package__
DEFAULT_TASK = f"{PACKAGE}.task"
TORCH_LOOP_ENGINES = (TORCH_DISTRIBUTOR, DEEPSPEED_ENGINE)  # what --handoff-to-torchrun can hand to torchrun
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OFFLOADS = ("none", "optimizer", "optimizer+weights")
PARALLELISMS, INIT_MODES = ("ddp", "fsdp2"), ("weights", "full")
LR_SCHEDULES = ("cosine", "linear", "constant")  # after the warm-up (training/loop.learning_rate_schedule)
SPARK_ML_APIS, SPARK_ML_MODELS = ("connect", "classic"), ("linear", "gbt", "random_forest")
DEFAULT_LOCAL_PROCESSES = 2
LOCAL_RUNS_DIR = os.path.join("build", "local-run")
CHECKPOINTS_DIR, STAGING_DIR = "checkpoints", "staging"  # in a run's folder
SHARED_FOLDERS = ("/Volumes/", "/dbfs/")  # what every node of a Databricks cluster reads as the same files
MAX_NODES, MAX_PROCESSES = 256, 1024


class ConfigError(ValueError):
    """The options cannot work together (or with this machine); the message names the option to change."""


# ------------------------------------------------------------------ parsing single values (while parsing)

def bounded(read: Callable[[str], Any], low: float, high: float = math.inf, *, low_open: bool = False,
            unreadable: str, too_low: str, too_high: str = "", not_finite: str = "") -> Callable[[str], Any]:
    """An argparse type: `read` the text (int or float), then hold the value within low..high (above low where
    `low_open`). Each message formats the `text` given, the `value` read, `low` and `high` (`not_finite`: inf, nan)."""
    def parse(text: str) -> Any:
        try:
            value = read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(unreadable.format(text=text, low=low, high=high)) from None
        refused = (not_finite if isinstance(value, float) and not math.isfinite(value) else
                   too_low if value < low or (low_open and value == low) else too_high if value > high else None)
        if refused is None:
            return value
        raise argparse.ArgumentTypeError(refused.format(text=text, value=value, low=low, high=high))
    return parse


def whole(low: int, high: int) -> Callable[[str], int]:
    outside = "{value} is outside {low}..{high}"
    return bounded(int, low, high, unreadable="{text!r} is not a whole number", too_low=outside, too_high=outside)


def number(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    bound = "above {low:g}" if low_open else "at least {low:g}"
    refused = "{text} must be a finite number " + bound + " and at most {high:g}"
    return bounded(float, low, high, low_open=low_open, unreadable="{text!r} is not a number", too_low=refused,
                   too_high=refused, not_finite=refused)


def whole_numbers(text: str) -> tuple[int, ...]:
    return tuple(whole(1, 1_000_000)(part) for part in text.split(","))


def betas(text: str) -> tuple[float, float]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 2 or not all(0 <= value < 1 for value in values):  # nan fails too
        raise argparse.ArgumentTypeError(f"{text!r} is not two numbers B1,B2, each at least 0 and below 1 (e.g. "
                                         "0.9,0.999)")
    return values


def json_file(text: str) -> dict:
    """A JSON object read from a file: what --deepspeed-config names (a DeepSpeed config, or `advise --json`)."""
    try:
        with open(text) as file:
            content = json.load(file)
    except (OSError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error}") from None
    if not isinstance(content, dict):
        raise argparse.ArgumentTypeError(f"{text} holds no JSON object")
    if "deepspeed_config" in content:  # the output of `advise --json`
        if not isinstance(content["deepspeed_config"], dict):
            raise argparse.ArgumentTypeError(f"the advice in {text} recommends no DeepSpeed (deepspeed_config is "
                                             "null): train with the engine it names, or drop --deepspeed-config")
        return content["deepspeed_config"]
    return content


def option(default: Any, help: str, *, parse: Callable | None = None, choices: tuple | None = None,
           metavar: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "parse": parse, "choices": choices, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    engine: str = option(None, "the training engine", choices=ENGINES)
    task: str = option(DEFAULT_TASK, "the task module to train (default: this project's task.py)", metavar="MODULE")
    local: bool = option(False, "train on CPU processes on a local Spark session (without --table: the task's sample)")
    table: str | None = option(None, "the table (catalog.schema.table) or parquet path to train on (default, or empty: "
                               "the task's table; with --local, its sample)", metavar="NAME_OR_PATH")
    output_dir: str | None = option(None, "this run's folder: staged data, checkpoints, metrics; on a cluster one all "
                                    "nodes read, /Volumes/<catalog>/<schema>/<volume>/<engine>/<job run id>; a rerun "
                                    f"resumes there (default with --local: {LOCAL_RUNS_DIR}/<engine>)", metavar="DIR")
    job_run_id: str | None = option(None, "the job run's id ({{job.run_id}}), recorded in MLflow and metrics.json; a "
                                    "serverless GPU job's stage task names its config by it", metavar="ID")
    num_nodes: int = option(1, "nodes to train on (default 1: one node first)", parse=whole(1, MAX_NODES), metavar="N")
    gpus_per_node: int | None = option(None, "GPUs per node, one process each (default: a training node's GPUs)",
                                       parse=whole(0, 64), metavar="G")
    processes: int | None = option(None, f"CPU processes per node instead of GPUs (default {DEFAULT_LOCAL_PROCESSES})",
                                   parse=whole(1, MAX_PROCESSES), metavar="N")
    epochs: int = option(8, "passes over the training data", parse=whole(1, 100_000))
    max_steps: int | None = option(None, "a budget in optimizer steps: the run, and its learning-rate schedule, end at "
                                   "the smaller of it and --epochs", parse=whole(1, 10 ** 9), metavar="STEPS")
    batch_size: int = option(64, "examples per step per process", parse=whole(1, 1_000_000))
    learning_rate: float = option(3e-3, "AdamW's peak learning rate", parse=number(0.0, 10.0, low_open=True))
    weight_decay: float = option(0.01, "AdamW's weight decay, on weight matrices only", parse=number(0.0, 1.0))
    adam_betas: tuple[float, float] = option((0.9, 0.95), "AdamW's decay rates of its gradients' running averages "
                                             "(fine-tuning often takes 0.9,0.999)", parse=betas, metavar="B1,B2")
    warmup_fraction: float = option(0.05, "share of the optimizer steps spent warming the learning rate up (then "
                                    "--lr-schedule)", parse=number(0.0, 0.5))
    lr_schedule: str = option("cosine", "the learning rate after the warm-up: a cosine or linear decay to "
                              "--min-lr-ratio at the last step, or constant at the peak", choices=LR_SCHEDULES)
    min_lr_ratio: float = option(0.1, "the floor a decay ends on, as a share of the peak learning rate",
                                 parse=number(0.0, 1.0), metavar="F")
    grad_clip: float = option(1.0, "clip the gradients' global norm to this (0: no clipping)", parse=number(0.0, 1e6))
    precision: str = option("auto", "mixed precision (auto: bf16, fp16 on older GPUs, fp32 on CPU)", choices=PRECISIONS)
    grad_accumulation: int = option(1, "micro-batches per optimizer step", parse=whole(1, 100_000), metavar="K")
    compile: bool = option(False, "torch.compile the model (slower first steps; on CPU it needs a C++ compiler)")
    activation_checkpointing: bool = option(False, "recompute the task's `blocks(model)` in the backward pass: less "
                                            "memory, a third more compute")
    seed: int = option(42, "seeds the split, the shuffles and the weights", parse=whole(0, 2 ** 31 - 1))
    collective_timeout: int = option(1800, "seconds a process waits for the others (to start, or in a collective) "
                                     "before the run stops with an error", parse=whole(10, 86_400), metavar="SECONDS")
    checkpoint_every: int = option(1, "epochs between checkpoints, in OUTPUT_DIR/checkpoints (the last always)",
                                   parse=whole(1, 100_000), metavar="EPOCHS")
    checkpoint_every_steps: int | None = option(None, "also checkpoint every this many optimizer steps, even mid-epoch "
                                                "(a resume goes on from it)", parse=whole(1, 10 ** 9), metavar="STEPS")
    log_every_steps: int = option(50, "optimizer steps between progress lines and MLflow metrics (loss, LR, grad norm, "
                                  "tokens/s, MFU, step time); 0: per epoch", parse=whole(0, 10 ** 9), metavar="STEPS")
    eval_every_steps: int | None = option(None, "also evaluate on --eval-batches held-out batches every this many "
                                          "optimizer steps (the whole held-out split is evaluated after every epoch "
                                          "and at the end)", parse=whole(1, 10 ** 9), metavar="STEPS")
    eval_batches: int = option(20, "held-out batches (of --batch-size, at most 256) per process in an evaluation "
                               "every --eval-every-steps",
                               parse=whole(1, 10 ** 6), metavar="N")
    keep_checkpoints: int = option(2, "how many of the newest checkpoints to keep", parse=whole(1, 1000), metavar="N")
    keep_staged_days: int = option(7, "a run that stages removes the staged rows of the finished runs beside it older "
                                   "than this (0: kept)", parse=whole(0, 100_000), metavar="DAYS")
    resume: bool = option(True, "start over instead of resuming from the newest complete checkpoint in OUTPUT_DIR")
    init_from: str | None = option(None, "start a new run from an earlier run's checkpoint: its output folder (its "
                                   "newest complete checkpoint), its checkpoints folder, or one checkpoint folder "
                                   "(used only while OUTPUT_DIR has no checkpoint of its own)", metavar="PATH")
    init_mode: str = option("weights", "what --init-from takes: weights (the model's; the optimizer, schedule and "
                            "steps start fresh) or full (the whole training state and the steps reached, for a run "
                            "like that one: same task, data, seed, batch and processes)", choices=INIT_MODES)
    tracking: bool = option(True, "do not log params, metrics and the model to MLflow")
    mlflow_experiment: str | None = option(None, "MLflow experiment (on Databricks a workspace path; default "
                                           "/Shared/<package>, OUTPUT_DIR/mlruns with --local)", metavar="NAME")
    register_model: str | None = option(None, "register the model in Unity Catalog too", metavar="CATALOG.SCHEMA.MODEL")
    parallelism: str = option("ddp", "ddp (a whole model on each process) or fsdp2 (each holds a slice of every "
                              "weight, gradient and optimizer state: for a model whose training state does not fit one "
                              "GPU; one process trains the model as it is)", choices=PARALLELISMS)
    zero_stage: int | None = option(None, "ZeRO stage (default: --deepspeed-config's, else 2)", parse=whole(0, 3))
    offload: str | None = option(None, "ZeRO CPU offload (default: --deepspeed-config's, else none)", choices=OFFLOADS)
    deepspeed_config: dict | None = option(None, "a DeepSpeed config, or the output of `advise --json`, to start from",
                                           parse=json_file, metavar="FILE")
    spark_ml_api: str | None = option(None, "Spark ML: connect (pyspark.ml.connect, the default) or classic "
                                      "(pyspark.ml over Spark Connect)", choices=SPARK_ML_APIS)
    spark_ml_model: str | None = option(None, "Spark ML's regressor (default linear; gbt and random_forest need "
                                        "--spark-ml-api classic)", choices=SPARK_ML_MODELS)
    handoff_to_torchrun: bool = option(False, "do not train: stage the data, write the config and torchrun command to "
                                       "OUTPUT_DIR/torchrun/ (a serverless GPU job's stage task; its GPU task trains)")
    task_options: Any = None  # the task's Options, built from its own options
    on_workers: bool = False  # resolved from the cluster: the ranks run on its workers' executors, else on the driver

    @property
    def task_name(self) -> str:
        return self.task.rsplit(".", 1)[-1]

    @property
    def staging_dir(self) -> str:
        return os.path.join(self.output_dir, STAGING_DIR)

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.output_dir, CHECKPOINTS_DIR)

    @functools.cached_property  # worked out once a process (a frozen config: `resolve` makes a new one)
    def placement(self) -> "Placement":
        """The processes of a resolved config (`resolve` has set gpus_per_node and on_workers)."""
        return Placement(self.num_nodes, self.gpus_per_node or self.processes or DEFAULT_LOCAL_PROCESSES,
                         use_gpu=bool(self.gpus_per_node), on_workers=self.on_workers)


@dataclass(frozen=True)
class Placement:
    """Where the processes of a run go: resolved once from the config, the same for every engine."""

    nodes: int
    processes_per_node: int  # one per GPU, or CPU processes
    use_gpu: bool
    on_workers: bool  # the workers' executors, else the driver

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        where = "on one node" if self.nodes == 1 else f"on {self.nodes} nodes"
        return f"{self.world_size} {kind} process(es) {where} ({self.processes_per_node} per node)"


# ------------------------------------------------------------------ the command line

def add_options(parser: argparse.ArgumentParser, of: type, title: str | None = None) -> None:
    """Every field of the dataclass `of` that has help (or any field, for a task's Options) as --field-name."""
    group = parser.add_argument_group(title) if title else parser
    for spec in (spec for spec in fields(of) if of is not Config or "help" in spec.metadata):
        meta = spec.metadata
        flag = "--" + spec.name.replace("_", "-")
        default = spec.default
        kwargs: dict[str, Any] = {"dest": spec.name, "help": meta.get("help", "")}
        if isinstance(default, bool):
            flag, action = ("--no-" + flag[2:], "store_false") if default else (flag, "store_true")
            group.add_argument(flag, action=action, **kwargs)
            continue
        parse = meta.get("parse") or (whole_numbers if isinstance(default, tuple) else
                                      number(-1e9, 1e9) if isinstance(default, float) else
                                      whole(-10 ** 9, 10 ** 9) if isinstance(default, int) else str)
        if default is not None and "default" not in kwargs["help"]:
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            kwargs["help"] += f" (default {shown})"
        group.add_argument(flag, type=parse, default=default, choices=meta.get("choices"),
                           metavar=meta.get("metavar"), required=spec.name == "engine", **kwargs)


def parser_for(task_module: str, engines: tuple[str, ...] = ENGINES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE} train",
                                     description="Train with one engine, on the cluster or locally (--local).")
    add_options(parser, Config)
    parser._option_string_actions["--engine"].choices = engines
    task_options = load_task(task_module).Options
    if clashes := [spec.name for spec in fields(task_options) if spec.name in {own.name for own in fields(Config)}]:
        raise TaskError(f"{task_module}.Options has the field(s) {', '.join(clashes)}, which clash with train's own "
                        f"option(s) of that name: rename them in Options (e.g. {clashes[0]} to task_{clashes[0]})")
    add_options(parser, task_options, f"the task ({task_module})")
    return parser


def from_args(argv: list[str], engines: tuple[str, ...] = ENGINES) -> Config:
    """Parse `train`'s command line: --task first, alone, since the task's options (which --help lists) depend on it."""
    task_option = argparse.ArgumentParser(add_help=False)
    task_option.add_argument("--task", default=DEFAULT_TASK)
    task_module = task_option.parse_known_args(argv)[0].task
    task = load_task(task_module)
    values = vars(parser_for(task_module, engines).parse_args(argv))
    task_options = task.Options(**{spec.name: values.pop(spec.name) for spec in fields(task.Options)})
    values["table"] = values["table"] or None  # a job passes its variable, empty for the task's own table
    return Config(**values, task_options=task_options)


def check(config: Config) -> None:
    if config.local and config.num_nodes > 1:
        raise ConfigError(f"--local runs on this machine, one node, but --num-nodes is {config.num_nodes}: drop "
                          "--num-nodes, or run without --local on a cluster with that many nodes")
    if config.local and config.gpus_per_node:
        raise ConfigError(f"--local trains on CPU processes, but --gpus-per-node is {config.gpus_per_node}: drop "
                          "it (--processes N sets the CPU processes), or run without --local on a GPU cluster")
    if config.processes and config.gpus_per_node:
        raise ConfigError(f"--processes {config.processes} and --gpus-per-node {config.gpus_per_node} both set the "
                          "number of processes: with GPUs there is one per GPU, so drop --processes")
    if config.parallelism != "ddp" and config.engine in (DEEPSPEED_ENGINE, SPARK_ML_ENGINE):
        raise ConfigError(f"--parallelism {config.parallelism} is for torch_distributor and ray, but the engine is "
                          f"{config.engine}: use --engine torch_distributor (DeepSpeed: --zero-stage 3), or drop it")
    refuse_unless_engine(config, DEEPSPEED_ENGINE, "DeepSpeed", "zero_stage", "offload", "deepspeed_config")
    if config.offload == "optimizer+weights" and (config.zero_stage or 3) != 3:
        raise ConfigError(f"--offload optimizer+weights needs ZeRO stage 3, but --zero-stage is {config.zero_stage}:"
                          " use --zero-stage 3, or --offload optimizer")
    refuse_unless_engine(config, SPARK_ML_ENGINE, "Spark ML", "spark_ml_api", "spark_ml_model")
    if config.spark_ml_model not in (None, "linear") and config.spark_ml_api != "classic":
        raise ConfigError(f"--spark-ml-model {config.spark_ml_model} is a pyspark.ml estimator, which "
                          "pyspark.ml.connect lacks: add --spark-ml-api classic")
    if config.precision == "fp16" and (config.local or config.processes or config.gpus_per_node == 0
                                       or config.engine == SPARK_ML_ENGINE):
        raise ConfigError("--precision fp16 needs GPUs, but this run trains on CPU (--local, --processes or "
                          "--gpus-per-node 0, or Spark ML): use fp32 (or bf16)")
    if config.register_model and not config.tracking:
        raise ConfigError("--register-model registers the model MLflow logs, but --no-tracking turns MLflow off: "
                          "drop one of them")
    if config.activation_checkpointing and not load_task(config.task).has_blocks:
        raise ConfigError(f"--activation-checkpointing recomputes the task's blocks, but {config.task} names none: "
                          "define blocks(model) there (see task_interface.py), or drop --activation-checkpointing")
    if config.handoff_to_torchrun and config.engine not in TORCH_LOOP_ENGINES:
        raise ConfigError(f"--handoff-to-torchrun hands the torch loop to torchrun, but {config.engine} does not "
                          f"train with it: use --engine {' or '.join(TORCH_LOOP_ENGINES)}")
    if config.handoff_to_torchrun and not config.local and not (config.gpus_per_node or config.processes):
        raise ConfigError("--handoff-to-torchrun plans a run on nodes this task does not see: give --gpus-per-node "
                          "(a node's GPUs, e.g. 8 for GPU_8xH100) and --num-nodes, or --processes for CPU ones")
    if config.handoff_to_torchrun and not config.local and config.tracking and not config.job_run_id:
        raise ConfigError("--handoff-to-torchrun names the run's config by its job run for the GPU task, but no "
                          "--job-run-id was given: pass --job-run-id {{job.run_id}} in the stage task's parameters")
    if not config.local and not config.output_dir:
        raise ConfigError("--output-dir is required on a cluster: give a folder every node reads, a Unity Catalog "
                          "volume path /Volumes/<catalog>/<schema>/<volume>/<run> (or use --local)")
    if config.output_dir and ("://" in config.output_dir or config.output_dir.startswith("dbfs:")):
        raise ConfigError(f"--output-dir {config.output_dir} is a URI, but the training processes read the staged "
                          "data as files: give a path, e.g. /Volumes/<catalog>/<schema>/<volume>/<run>")
    if config.init_mode != "weights" and not config.init_from:
        raise ConfigError(f"--init-mode {config.init_mode} says what --init-from takes, but --init-from is not given: "
                          "give the earlier run's folder with --init-from, or drop --init-mode")
    if config.init_from:
        check_init_source(config)
    refuse_node_local_output(config)


def refuse_node_local_output(config: Config, on_workers: bool = False) -> None:  # again once `resolve` knows where
    if (config.num_nodes > 1 or on_workers) and not (config.output_dir or "").startswith(SHARED_FOLDERS):
        raise ConfigError(f"--output-dir {config.output_dir} is not shared between nodes, but the ranks on the "
                          "workers read the staged data from it: give a Unity Catalog volume path, "
                          "/Volumes/<catalog>/<schema>/<volume>/<run>")


def refuse_unless_engine(config: Config, engine: str, what: str, *names: str) -> None:
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(config, name) is not None]
    if given and config.engine != engine:
        raise ConfigError(f"{', '.join(given)} configure {what}, but the engine is {config.engine}: use --engine "
                          f"{engine}, or drop them")


def check_init_source(config: Config) -> None:
    source = os.path.abspath(config.init_from)
    if not os.path.exists(source):
        raise ConfigError(f"--init-from {config.init_from} does not exist: give an earlier run's output folder, its "
                          "checkpoints folder, or one of its checkpoints")
    own = os.path.abspath(config.output_dir or default_output_dir(config))
    if source == own or source.startswith(own + os.sep):
        raise ConfigError(f"--init-from {config.init_from} is inside this run's own --output-dir: a rerun into that "
                          "folder resumes there by itself; drop --init-from, or give the new run another --output-dir")


def default_output_dir(config: Config) -> str:
    """--local's folder: one per engine and task, so that no run resumes another engine's or task's checkpoints."""
    name = config.engine if config.task == DEFAULT_TASK else f"{config.engine}-{config.task_name}"
    return os.path.join(LOCAL_RUNS_DIR, name)


# ------------------------------------------------------------------ the run's config as a file (torchrun hand-off)

def to_json(config: Config) -> dict:
    return {**dataclasses.asdict(config), "task_options": dataclasses.asdict(config.task_options)}


def from_json(content: Any, source: str) -> Config:
    if not isinstance(content, dict) or not {"engine", "task", "output_dir", "task_options"} <= set(content):
        raise ValueError(f"{source} is not a run's config: write it with `train --handoff-to-torchrun`")
    if unknown := sorted(set(content) - {spec.name for spec in fields(Config)}):
        raise ValueError(f"{source} has unknown fields {', '.join(unknown)}: it was written by another version of "
                         "this package; run `train --handoff-to-torchrun` again with this one")
    task = load_task(content["task"])
    tuples = {spec.name: tuple(content[spec.name]) for spec in fields(Config)
              if isinstance(spec.default, tuple) and spec.name in content}  # JSON's lists
    return Config(**{**content, **tuples, "task_options": task_options(task, content["task_options"])})


def task_options(task, values: dict):
    """The task's Options from their JSON (lists back to tuples; a field missing takes its default)."""
    return task.Options(**{spec.name: tuple(value) if isinstance(spec.default, tuple) else value
                           for spec in fields(task.Options) for value in [values.get(spec.name, spec.default)]})
