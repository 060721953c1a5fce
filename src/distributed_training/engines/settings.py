"""What the `train` command was asked to do, checked once, in the terms every engine shares."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..compute.engines import REQUIREMENTS, SPARK_ML_CONNECT
from ..compute.serverless import SERVERLESS_ENGINES
from ..training.spark_ml import CLASSIC, CONNECT, LINEAR, MODELS
from ..training.trips import DEFAULT_TABLE

DEFAULT_LOCAL_OUTPUT_DIR = os.path.join("build", "local-run")
DEFAULT_LOCAL_PROCESSES = 2
SHARED_FOLDERS = ("/Volumes/", "/dbfs/")  # what every node of a Databricks cluster sees as the same files


class LaunchError(Exception):
    """The run cannot start (or did not finish) as asked; the message says why and what to do."""


@dataclass(frozen=True)
class RunSettings:
    engine: str
    local: bool  # CPU processes on a local Spark session, instead of the cluster this driver runs on
    table: str | None  # table name or parquet path; None with local: a generated sample (the launcher writes it)
    output_dir: str  # absolute: the launcher, Spark and the worker processes may each have another working dir
    num_nodes: int
    gpus_per_node: int  # 0: CPU processes instead
    processes: int | None  # CPU processes, when gpus_per_node is 0; None: the engine's default
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    # The loop's options (defaults: what `train` defaults to)
    precision: str = "auto"  # auto: bf16 on GPUs that have it, fp16 on older GPUs, fp32 on CPU
    grad_accumulation: int = 1
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    resume: bool = True
    tracking: bool = True
    mlflow_experiment: str | None = None  # None: a default per place (run_options)
    register_model: str | None = None  # a Unity Catalog model name, catalog.schema.model
    # DeepSpeed (None: from --deepspeed-config, else DeepSpeed's defaults here: ZeRO 2, no offload)
    zero_stage: int | None = None
    offload: str | None = None
    deepspeed_config_file: str | None = None
    # Spark ML (--engine spark_ml_connect)
    spark_ml_api: str = CONNECT  # pyspark.ml.connect; CLASSIC: pyspark.ml over Spark Connect
    spark_ml_model: str = LINEAR
    # Stage and plan only: the loop then runs under torchrun elsewhere (a serverless GPU task), see torchrun_handoff
    handoff_to_torchrun: bool = False
    command_path: str | None = None  # where the handoff writes the torchrun command; None: beside the config


def settings_from_args(args) -> RunSettings:
    """The command line's options as RunSettings, or a LaunchError naming the conflict and the fix."""
    if args.local:
        if args.num_nodes > 1:
            raise LaunchError(
                f"--local runs on this machine, one node, but --num-nodes is {args.num_nodes}: drop --num-nodes, "
                "or run without --local on a cluster with that many nodes"
            )
        if args.gpus_per_node:
            raise LaunchError(
                f"--local trains on CPU processes, but --gpus-per-node is {args.gpus_per_node}: drop "
                "--gpus-per-node (use --processes N for the number of CPU processes), or run without --local on "
                "a GPU cluster"
            )
    elif not args.output_dir:
        raise LaunchError(
            "--output-dir is required on a cluster: give a folder every node can read, a Unity Catalog volume "
            "path such as /Volumes/<catalog>/<schema>/<volume>/<run> (or use --local to train on this machine)"
        )
    if args.processes and args.gpus_per_node:
        raise LaunchError(
            f"--processes {args.processes} and --gpus-per-node {args.gpus_per_node} both set the number of "
            "processes: with GPUs there is one process per GPU (gpus per node x nodes), so drop --processes"
        )
    deepspeed_options = [option for option, value in (("--zero-stage", args.zero_stage), ("--offload", args.offload),
                         ("--deepspeed-config", args.deepspeed_config)) if value is not None]
    if deepspeed_options and args.engine != "deepspeed":
        raise LaunchError(f"{', '.join(deepspeed_options)} configure DeepSpeed, but the engine is {args.engine}: "
                          "use --engine deepspeed, or drop them")
    _check_spark_ml_options(args)
    _check_handoff(args)
    output_dir = args.output_dir or DEFAULT_LOCAL_OUTPUT_DIR
    if "://" in output_dir or output_dir.startswith("dbfs:"):
        raise LaunchError(
            f"--output-dir {output_dir} is a URI, but the training processes read the staged data as files: give "
            "a path, e.g. /Volumes/<catalog>/<schema>/<volume>/<run> on a cluster or a local folder with --local"
        )
    if args.num_nodes > 1 and not output_dir.startswith(SHARED_FOLDERS):
        raise LaunchError(
            f"--output-dir {output_dir} is not shared between nodes, but the ranks on all {args.num_nodes} nodes "
            "read the staged data from it: give a Unity Catalog volume path, /Volumes/<catalog>/<schema>/<volume>/<run>"
        )
    return RunSettings(
        engine=args.engine,
        local=args.local,
        table=args.table or (None if args.local else DEFAULT_TABLE),
        output_dir=os.path.abspath(output_dir),
        num_nodes=args.num_nodes,
        gpus_per_node=_gpus_per_node(args),
        processes=args.processes,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        precision=args.precision,
        grad_accumulation=args.grad_accumulation,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        tracking=args.tracking,
        mlflow_experiment=args.mlflow_experiment,
        register_model=args.register_model,
        zero_stage=args.zero_stage,
        offload=args.offload,
        deepspeed_config_file=args.deepspeed_config,
        spark_ml_api=args.spark_ml_api or CONNECT,
        spark_ml_model=args.spark_ml_model or LINEAR,
        handoff_to_torchrun=args.handoff_to_torchrun,
        command_path=args.command_path and os.path.abspath(args.command_path),
    )


def _check_handoff(args) -> None:
    if not args.handoff_to_torchrun:
        if args.command_path:
            raise LaunchError("--command-path says where --handoff-to-torchrun writes its command, but the run is not "
                              "handed off: add --handoff-to-torchrun, or drop --command-path")
        return
    if args.engine not in SERVERLESS_ENGINES:
        raise LaunchError(f"--handoff-to-torchrun hands the torch loop to torchrun, but {args.engine} does not train "
                          f"with it: use --engine {' or '.join(SERVERLESS_ENGINES)}, or drop --handoff-to-torchrun")
    if not args.local and not args.gpus_per_node:
        raise LaunchError("--handoff-to-torchrun plans a run on GPU nodes this task does not see: give "
                          "--gpus-per-node (the GPUs of one node, e.g. 8 for GPU_8xH100) and --num-nodes")


def _check_spark_ml_options(args) -> None:
    given = [option for option, value in (("--spark-ml-api", args.spark_ml_api),
                                          ("--spark-ml-model", args.spark_ml_model)) if value is not None]
    if given and args.engine != SPARK_ML_CONNECT:
        raise LaunchError(f"{', '.join(given)} configure Spark ML, but the engine is {args.engine}: use --engine "
                          "spark_ml_connect, or drop them")
    if args.spark_ml_model not in (None, *MODELS[CONNECT]) and args.spark_ml_api != CLASSIC:
        raise LaunchError(f"--spark-ml-model {args.spark_ml_model} is a pyspark.ml estimator, which pyspark.ml.connect "
                          "lacks: add --spark-ml-api classic (pyspark.ml over Spark Connect)")


def _gpus_per_node(args) -> int:
    """None given: CPU when asked for CPU processes, running locally or for an engine that uses no GPU (no torch
    needed then), else as many GPUs as the driver sees."""
    if args.gpus_per_node is not None:
        return args.gpus_per_node
    if args.local or args.processes or not REQUIREMENTS[args.engine].uses_gpu:
        return 0
    import torch

    return torch.cuda.device_count()


@dataclass(frozen=True)
class TrainingRun:
    """What an engine did (one line for people) and the metrics the training returned."""

    description: str
    metrics: dict
