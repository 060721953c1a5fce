"""`train --engine E`: the jobs' entry point on a cluster, and with `--local` a complete run on this machine.

On a cluster the Spark session is the driver's own, a preflight checks the cluster against the request, and the
outputs go to --output-dir (a Unity Catalog volume). With `--local` a local Spark session starts, and without
--table a sample of the default table is written under the output folder first.

Each engine is one module of this package named after it, with `train(spark, settings) -> TrainingRun`; an engine
whose module is absent is not offered. An engine that needs another local session than local[N] (executors of their
own, Spark Connect) also has `local_session(settings, warehouse_dir)`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from dataclasses import replace

from ..compute.engines import ENGINES
from .settings import (DEFAULT_LOCAL_OUTPUT_DIR, DEFAULT_LOCAL_PROCESSES, LaunchError, RunSettings, TrainingRun,
                       settings_from_args)

SAMPLE_TABLE_DIR = "sample_trips"
WAREHOUSE_DIR = "spark-warehouse"


def implemented_engines() -> list[str]:
    """The engines that have a launcher module here (a generated project carries only the ones it chose)."""
    return [name for name in ENGINES if importlib.util.find_spec(f"{__package__}.{name}") is not None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..training.spark_ml import APIS, CLASSIC, MODELS
    from ..training.trips import DEFAULT_TABLE

    parser.add_argument("--engine", required=True, choices=implemented_engines(), help="the training engine")
    parser.add_argument("--local", action="store_true",
                        help="train on CPU processes on a local Spark session; without --table, on a sample table "
                             "it creates (same schema as the default table)")
    parser.add_argument("--table", metavar="NAME_OR_PATH",
                        help=f"table (catalog.schema.table) or parquet path to train on (default: {DEFAULT_TABLE}; "
                             "with --local, the generated sample)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="where the staged data and metrics go; required on a cluster, where every node must "
                             "read it: /Volumes/<catalog>/<schema>/<volume>/<run> "
                             f"(default with --local: {DEFAULT_LOCAL_OUTPUT_DIR})")
    parser.add_argument("--num-nodes", type=_at_least(1), default=1, metavar="N",
                        help="nodes to train on (default 1: single node first)")
    parser.add_argument("--gpus-per-node", type=_at_least(0), metavar="G",
                        help="GPUs per node, one process each (default: the GPUs the driver sees)")
    parser.add_argument("--processes", type=_at_least(1), metavar="N",
                        help="CPU processes instead of GPUs: with --local, or on a cluster without --gpus-per-node "
                             f"(default {DEFAULT_LOCAL_PROCESSES})")
    parser.add_argument("--epochs", type=_at_least(1), default=8, help="passes over the training data (default 8)")
    parser.add_argument("--batch-size", type=_at_least(1), default=64, help="rows per step per process (default 64)")
    parser.add_argument("--learning-rate", type=_positive_float, default=3e-3, help="Adam's step size (default 3e-3)")
    parser.add_argument("--seed", type=int, default=42, help="seeds the split, the shuffles and the weights")
    loop = parser.add_argument_group("training loop")
    loop.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                      help="mixed precision on GPU (default auto: bf16 where the GPU has it, else fp16; fp32 on CPU)")
    loop.add_argument("--grad-accumulation", type=_at_least(1), default=1, metavar="K",
                      help="micro-batches per optimizer step (default 1)")
    loop.add_argument("--checkpoint-every", type=_at_least(1), default=1, metavar="EPOCHS",
                      help="epochs between checkpoints, in OUTPUT_DIR/checkpoints (default 1; the last always)")
    loop.add_argument("--keep-checkpoints", type=_at_least(1), default=2, metavar="N",
                      help="how many of the newest checkpoints to keep (default 2)")
    loop.add_argument("--no-resume", dest="resume", action="store_false",
                      help="start over instead of resuming from the newest complete checkpoint in OUTPUT_DIR")
    loop.add_argument("--mlflow-experiment", metavar="NAME",
                      help="MLflow experiment (on Databricks a workspace path; default /Shared/distributed-training "
                           "on a cluster, distributed-training in OUTPUT_DIR/mlruns with --local)")
    loop.add_argument("--register-model", metavar="CATALOG.SCHEMA.MODEL",
                      help="also register the trained model in Unity Catalog under this name")
    loop.add_argument("--no-tracking", dest="tracking", action="store_false", help="do not log to MLflow")
    deepspeed = parser.add_argument_group("DeepSpeed (--engine deepspeed)")
    deepspeed.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3),
                           help="ZeRO stage (default: from --deepspeed-config, else 2)")
    deepspeed.add_argument("--offload", choices=("none", "optimizer", "optimizer+weights"),
                           help="CPU offload (default: from --deepspeed-config, else none; weights need stage 3)")
    deepspeed.add_argument("--deepspeed-config", metavar="FILE",
                           help="a DeepSpeed config, or the output of `advise --json`, to start from")
    spark_ml = parser.add_argument_group("Spark ML (--engine spark_ml_connect)")
    spark_ml.add_argument("--spark-ml-api", choices=APIS,
                          help="connect: pyspark.ml.connect (default); classic: pyspark.ml over Spark Connect, "
                               "for more estimators")
    spark_ml.add_argument("--spark-ml-model", choices=MODELS[CLASSIC],
                          help="the regressor (default linear; gbt and random_forest need --spark-ml-api classic)")
    parser.add_argument("--handoff-to-torchrun", action="store_true",
                        help="stage the data and write the run's config and torchrun command to "
                             "OUTPUT_DIR/torchrun/ instead of training (the serverless GPU job's first task; "
                             "its GPU task runs the command on every node)")
    parser.add_argument("--command-path", metavar="FILE",
                        help="with --handoff-to-torchrun: where the command goes (default "
                             "OUTPUT_DIR/torchrun/command.sh); the serverless GPU job gives the workspace path its "
                             "ai_runtime_task runs")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    spark = None
    try:
        settings = settings_from_args(args)
        engine = importlib.import_module(f".{settings.engine}", __package__)
        spark = _local_session(engine, settings) if settings.local else _cluster_session(settings)
        if settings.local and settings.table is None:
            settings = replace(settings, table=_write_sample_table(spark, settings))
        if settings.handoff_to_torchrun:
            from .torchrun_handoff import hand_off

            hand_off(engine.configure(spark, settings), settings)
            return 0
        result = engine.train(spark, settings)
    except LaunchError as error:
        failure = error
    else:
        failure = None
    finally:
        # Stopped before the error is printed: what Spark logs as it winds down (cancelled jobs) comes above it.
        if spark is not None and args.local:
            spark.stop()
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        return 1
    _report(settings, result, time.perf_counter() - started)
    return 0


def _local_session(engine, settings: RunSettings):
    from .local_spark import local_spark_session

    processes = settings.processes or DEFAULT_LOCAL_PROCESSES
    warehouse_dir = os.path.join(settings.output_dir, WAREHOUSE_DIR)
    try:
        if hasattr(engine, "local_session"):
            return engine.local_session(settings, warehouse_dir)
        return local_spark_session(cores=max(processes, 2), warehouse_dir=warehouse_dir)
    except Exception as error:  # pyspark reports a missing Java or a port it cannot bind in many shapes
        raise LaunchError(
            f"could not start a local Spark session ({str(error).splitlines()[0]}): --local needs Java 17 or "
            "newer on PATH or in JAVA_HOME, and SPARK_LOCAL_IP=127.0.0.1 where the host name does not resolve"
        ) from None


def _cluster_session(settings: RunSettings):
    """The driver's session, after the preflight: the cluster against what the job asks for.

    Off the cluster, with Databricks Connect installed (it replaces pyspark), the session is a remote one to the
    cluster that the Databricks configuration names (DATABRICKS_CLUSTER_ID, a profile, ...)."""
    from ..compute.preflight import PreflightError, TrainingRequest, ensure_ready

    spark = _remote_session() if "DATABRICKS_RUNTIME_VERSION" not in os.environ else None
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        print("preflight skipped: a Spark Connect session does not show the cluster's hardware to the client")
        return spark
    if settings.handoff_to_torchrun:
        return spark  # the GPUs are those of the task that runs the command, not this one's
    try:
        ensure_ready(spark, TrainingRequest(settings.engine, settings.num_nodes, settings.gpus_per_node))
    except PreflightError as error:
        raise LaunchError(str(error)) from None
    return spark


def _remote_session():
    """Off the cluster: a Databricks Connect session, or None when databricks-connect is not installed."""
    try:
        from databricks.connect import DatabricksSession
    except ImportError:
        return None
    return DatabricksSession.builder.getOrCreate()


def _write_sample_table(spark, settings: RunSettings) -> str:
    from ..training.sample_data import write_sample_trips

    path = os.path.join(settings.output_dir, SAMPLE_TABLE_DIR)
    print(f"writing a sample trips table (the schema of the default table) to {path}")
    return write_sample_trips(spark, path, seed=settings.seed)


def _report(settings: RunSettings, result: TrainingRun, seconds: float) -> None:
    metrics, final = result.metrics, result.metrics["final"]
    epochs = f", {len(metrics['epochs'])} epochs" if "epochs" in metrics else ""
    staged = f"  staged   {metrics['staged_data']} (train/ and test/ parquet, manifest.json)\n" \
        if "staged_data" in metrics else ""
    model = f"  model    {metrics['model_dir']}\n" if "model_dir" in metrics else ""
    print(
        f"\nTrained with {settings.engine}: {result.description}{epochs}.\n"
        f"  data     {settings.table}: {metrics['train_rows']} training rows, {metrics['test_rows']} held out\n"
        f"{staged}{model}"
        f"  metrics  {metrics['metrics_file']}\n"
        f"  result   held-out RMSE {final['test_rmse']:.3f}, MAE {final['test_mae']:.3f} (fare_amount); "
        f"predicting the mean: RMSE {final['baseline_rmse']:.3f}\n"
        f"  time     {seconds:.1f} s"
    )


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum, {minimum}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value
