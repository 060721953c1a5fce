"""`train --engine E`: the jobs' entry point on a cluster, and with --local a complete run on this machine.

In order: the options (a resume of another run refused before Spark starts), the output folder (taken: a second run
into it is refused at once), the Spark session (after the preflight on a cluster), the config resolved against it (the
resume checked again), then the engine's training, or with --handoff-to-torchrun the staging and torchrun's plan."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress

import psutil

from . import config as configuration
from .config import Config, ConfigError
from .data.staging import TableError
from .engines import LaunchError, TrainingRun, available, engine as engine_named
from .run_folder import FolderInUse, announce_finished, held
from .task_interface import TaskError
from .training.checkpoints import refusal_to_resume

SAMPLE_TABLE_DIR = "sample_table"


def main(argv: list[str] | None = None) -> int:
    """`python -m <package> train ...`; the exit code: 0 trained, 1 failed, 2 bad options."""
    try:
        config = configuration.from_args(sys.argv[1:] if argv is None else argv, available())
        configuration.check(config)
        output_dir = config.output_dir or configuration.default_output_dir(config)
        config = dataclasses.replace(config, output_dir=os.path.abspath(output_dir),
                                     init_from=config.init_from and os.path.abspath(config.init_from))
    except (ConfigError, TaskError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if refusal := refusal_to_resume(config):  # first: a run that finished in the folder may be another run
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    if announce_finished(config):
        return 0
    try:
        with held(config.output_dir), _interruptible():
            config, result = _run(config)
    except (ConfigError, FolderInUse, LaunchError, TableError, TaskError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt as interruption:  # with no number: Ctrl-C before the handlers, or under Ray's own
        number = getattr(interruption, "number", signal.SIGINT)
        print(f"error: interrupted by {signal.Signals(number).name}; every process it started has ended. Run the same "
              "command again to resume from the last checkpoint (unless it has --no-resume)", file=sys.stderr)
        return 128 + number  # the shell's code for a process ended by that signal: 130 for Ctrl-C, 143 for SIGTERM
    if result is not None:
        _report(config, result, time.perf_counter() - started)
    return 0


def train_main() -> None:
    """The wheel's `train` entry point for a job's python_wheel_task: it exits, so that a failed run fails the task."""
    sys.exit(main())


def _run(config: Config) -> tuple[Config, TrainingRun | None]:  # no TrainingRun when handed to torchrun
    engine = engine_named(config.engine)
    spark = None
    try:
        spark = _local_session(engine, config) if config.local else _cluster_session(config)
        if signal.getsignal(signal.SIGTERM) is _interrupt:
            signal.signal(signal.SIGINT, _interrupt)  # in place of the one a new SparkContext installs
        config = resolve(config, engine, spark)
        if config.local:  # the cores shared out: torchrun's default, 1 thread a process, comes with a banner each run
            os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // config.placement.world_size)))
        # the processes, now that the GPUs are known: before anything is staged
        if refusal := refusal_to_resume(config):
            raise ConfigError(refusal)
        if config.handoff_to_torchrun:
            from .engines.torchrun import hand_off

            hand_off(spark, config, _tracking_environment(config))
            return config, None
        return config, engine.train(spark, config, _tracking_environment(config))
    finally:
        # Stopped before an error is printed: what Spark logs as it winds down (cancelled jobs) comes above it.
        if spark is not None and config.local:
            with suppress(Exception):  # its JVM gone already: a signal to the whole process group ended it too
                spark.stop()


# SIGINT (Ctrl-C) and SIGTERM (a cancelled job, a stopped container) end a run alike. The exception is raised where
# the run is, with the processes it has started: as it passes, the distributor's own clean-up (which kills torchrun
# half a second after asking it to stop) can orphan torchrun's ranks, which are then no longer this one's descendants.
def _interrupt(number: int, frame) -> None:
    with open(os.devnull, "w") as nowhere:  # until it has passed: what it interrupts reports it, tracebacks and all
        os.dup2(nowhere.fileno(), 2)  # (py4j's calls, pyspark's shutdown, Spark's accumulator server)
    interruption = KeyboardInterrupt(signal.Signals(number).name)
    interruption.number, interruption.started = number, psutil.Process().children(recursive=True)
    raise interruption


# Once the interruption has passed the run (and Spark has stopped), every process the run started gets SIGTERM,
# 10 s to end, then SIGKILL, with further signals ignored meanwhile; the handlers are as they were after.
@contextmanager
def _interruptible():
    numbers = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    previous = {number: signal.signal(number, _interrupt) for number in numbers}
    stderr = os.dup(2)
    try:
        yield
    except KeyboardInterrupt as interruption:
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)
        processes = {*getattr(interruption, "started", ()), *psutil.Process().children(recursive=True)}
        for ending in (signal.SIGTERM, signal.SIGKILL):
            for process in processes:
                with suppress(psutil.Error):
                    process.send_signal(ending)
            processes = psutil.wait_procs(processes, timeout=10)[1]
        raise
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        for number, handler in previous.items():
            signal.signal(number, handler)


def resolve(config: Config, engine, spark) -> Config:
    """What depends on where the run is: on workers or driver, GPUs per node, precision, table (--local: a sample)."""
    on_workers = not (config.local or config.handoff_to_torchrun) and _trains_on_workers(spark)
    configuration.refuse_node_local_output(config, on_workers)
    gpus = config.gpus_per_node
    if gpus is None:
        on_cpu = config.local or config.processes or config.engine == "spark_ml_connect"
        gpus = 0 if on_cpu else _node_gpus(on_workers, spark)
    precision = config.precision
    if precision == "fp16" and not gpus:
        raise ConfigError("--precision fp16 needs GPUs, but this run trains on CPU: use fp32 (or bf16)")
    if precision == "auto":
        precision = "fp32" if not gpus else "bf16" if config.handoff_to_torchrun or _bf16_supported() else "fp16"
    table = config.table
    if table is None and config.local:  # written once: a rerun's staging finds its source unchanged
        table = os.path.join(config.output_dir, SAMPLE_TABLE_DIR, f"{config.task}-seed-{config.seed}")
        if not os.path.exists(os.path.join(table, "_SUCCESS")):
            print(f"writing a sample table (shaped like {engine.default_table(config)}) to {table}", flush=True)
            engine.sample_table(spark, config).coalesce(1).write.mode("overwrite").parquet(table)
    return dataclasses.replace(config, gpus_per_node=gpus, precision=precision, on_workers=on_workers,
                               table=table or engine.default_table(config))


def _trains_on_workers(spark) -> bool:  # a Spark Connect session has no SparkContext: Databricks' usage tag alone
    from .compute.preflight import WORKERS_CONF, observe

    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    return int(spark.conf.get(WORKERS_CONF, "0")) > 0 if connect else observe(spark).trains_on_workers


def _node_gpus(on_workers: bool, spark) -> int:
    """On the workers an executor's GPUs (a worker's: the driver there may be a smaller node), else the driver's."""
    import torch

    from .compute.preflight import EXECUTOR_GPUS_CONF

    return int(float(spark.conf.get(EXECUTOR_GPUS_CONF, "0"))) if on_workers else torch.cuda.device_count()


def _bf16_supported() -> bool:
    """Ampere and newer by the driver's GPU, the workers' model; emulated bf16 (T4, V100: slow) gets fp16."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def _local_session(engine, config: Config):
    try:
        spark = engine.local_session(config)
    except Exception as error:  # pyspark reports a missing Java or a port it cannot bind in many shapes
        raise LaunchError(f"could not start a local Spark session ({str(error).splitlines()[0]}): --local needs Java "
                          "17 or newer on PATH or in JAVA_HOME, and SPARK_LOCAL_IP=127.0.0.1 where the host name "
                          "does not resolve") from None
    # A signal to the whole process group may end the JVM first: pyspark's accumulator server then meets EOF and
    # prints its traceback above the run's one line, which says what ended it. (A Connect session has no server.)
    if server := getattr(getattr(spark, "_sc", None), "_accumulatorServer", None):
        server.handle_error = lambda *request, default=server.handle_error: (
            None if isinstance(sys.exc_info()[1], EOFError) else default(*request))
    return spark


def _cluster_session(config: Config):
    """The driver's session, after the preflight (the cluster against the job's needs). Off the cluster, with Databricks
    Connect installed, a remote session to the cluster its configuration names (DATABRICKS_CLUSTER_ID, a profile)."""
    from .compute.preflight import PreflightError, TrainingRequest, ensure_ready

    spark = _remote_session() if "DATABRICKS_RUNTIME_VERSION" not in os.environ else None
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        print("preflight skipped: a Spark Connect session does not show the cluster's hardware to the client")
        return spark
    if config.handoff_to_torchrun:
        return spark  # the GPUs are those of the task that runs the command, not this one's
    try:
        ensure_ready(spark, TrainingRequest(config.engine, config.num_nodes, config.gpus_per_node or 0))
    except PreflightError as error:
        raise LaunchError(str(error)) from None
    return spark


def _remote_session():  # None without databricks-connect
    try:
        from databricks.connect import DatabricksSession
    except ImportError:
        return None
    return DatabricksSession.builder.getOrCreate()


def _tracking_environment(config: Config) -> dict[str, str]:
    """Host and token of the job's context, for worker processes that log to the workspace's MLflow: they do not
    inherit the driver's notebook context, and the platform's documented remedy is to hand them DATABRICKS_HOST and
    DATABRICKS_TOKEN (as an argument, never in a file). Empty off Databricks, or where the environment has them."""
    if config.local or not config.tracking or (os.getenv("DATABRICKS_HOST") and os.getenv("DATABRICKS_TOKEN")):
        return {}
    try:
        from databricks.sdk.runtime import dbutils

        context = dbutils.notebook.entry_point.getDbutils().notebook().getContext()
        return {"DATABRICKS_HOST": context.apiUrl().get(), "DATABRICKS_TOKEN": context.apiToken().get()}
    except Exception:  # not on Databricks, or no context to ask: nothing to hand over
        return {}


def _report(config: Config, result: TrainingRun, seconds: float) -> None:
    metrics = result.metrics
    shown = {name: value for name, value in metrics["final"].items()
             if name not in ("epoch", "step", "train_seconds", "examples_per_second", "learning_rate")}
    lines = [f"\nTrained with {config.engine}: {result.description}.",
             f"  data     {config.table}",
             f"  result   held-out loss {metrics['held_out_loss']:.4f}; the trivial predictor's: "
             f"{metrics['baseline_loss']:.4f}",
             "  scores   " + ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                                      for name, value in shown.items()),
             f"  metrics  {metrics['metrics_file']}"]
    if "step" in metrics:  # the torch loop's runs (Spark ML fits once)
        tokens = metrics["tokens_per_second"]
        speed = f"{tokens:,.0f} tokens/s" if tokens else f"{metrics['examples_per_second']:,.0f} examples/s"
        utilisation = f", MFU {metrics['mfu']:.1%}" if metrics["mfu"] is not None else ""
        lines.insert(2, f"  steps    {metrics['step']} in {metrics['epochs'][-1]['epoch']} epoch(s), {speed}"
                        f"{utilisation}")
    if "model_dir" in metrics:
        lines.append(f"  model    {metrics['model_dir']}")
    lines.append(f"  time     {seconds:.1f} s")
    print("\n".join(lines))
