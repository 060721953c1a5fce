"""`score --model RUN_DIR`: a run's model on Spark's Python workers over each row of a table once (README)."""
# The model is model.pt, or a Spark ML run's pipeline; each row comes out once with the task's outputs (null where
# `prepare` drops it), or only the run's held-out rows (`--rows held-out`); one model per Python worker (`mapInPandas`),
# on the GPU Spark gives its task, or on one node `--models-per-gpu` a GPU, bf16 where supported. The output is
# replaced whole, never appended to.

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

from .config import DEFAULT_TASK, PACKAGE, SPARK_ML_ENGINE, STAGING_DIR, task_options, whole
from .data.staged import StagedData
from .data.staging import TableError, cause, column, fingerprint, looks_like_path, read_table, spark_errors, split
from .files import write_folder_atomically
from .run_folder import METRICS_FILE, MODEL_FILE
from .task_interface import SCORING, TaskError, load_task

ROW = "_score_row"  # each input row's key, while it is scored
_models: dict = {}  # in each Python worker: the model it loaded, by model.pt's path and time (a rerun rewrites it)


class ScoringError(ValueError):
    """The run cannot be scored as asked: the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Scoring:
    run_dir: str
    engine: str
    task: str  # the task module (Spark ML: its engine)
    options: object  # the task's Options
    stats: dict | None
    seed: int
    source: dict | None  # the run's table and its fingerprint when staged: where its held-out rows come from
    table: str
    output: str
    held_out: bool
    batch_size: int
    models_per_gpu: int


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE} score", description="Score a table with a run's model.")
    parser.add_argument("--model", required=True, action="append", metavar="RUN_DIR", help="the run's folder or its "
                        "MLflow model (runs:/ID/model, models:/NAME/VERSION, models:/NAME@ALIAS); the last not empty")
    parser.add_argument("--table", help="catalog.schema.table or a parquet path (default: the run's own)")
    parser.add_argument("--output-table", metavar="TABLE", help="a table or parquet path (default RUN_DIR/scores)")
    parser.add_argument("--rows", choices=("all", "held-out"), default="all", help="each row once, or the held-out set")
    parser.add_argument("--batch-size", type=whole(1, 1 << 20), default=512, help="rows a model call (default 512)")
    parser.add_argument("--models-per-gpu", type=whole(1, 64), default=1, help="models a GPU holds, on one node")
    parser.add_argument("--task", default=DEFAULT_TASK, help="the task the run must have trained")
    parser.add_argument("--local", action="store_true", help="score on local Spark, on this machine's CPU")
    return parser


def parse(argv: list[str]) -> tuple[Scoring, bool]:
    args = parser().parse_args(argv)
    args.model = ([model for model in args.model if model] or [""])[-1]  # a job's model parameter, after its run's
    run_dir = run_folder_of(args.model)
    try:
        with open(os.path.join(run_dir, METRICS_FILE)) as file:
            metrics = json.load(file)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ScoringError(f"--model {args.model} holds no finished training run ({METRICS_FILE}: {reason}): give "
                           "the output folder of a run that finished") from None
    if args.rows == "held-out" and args.table:
        raise ScoringError(f"--rows held-out scores the rows the run held out of its own table, but --table names "
                           f"{args.table}: drop one of them")
    output = args.output_table or os.path.join(run_dir, "scores")
    if looks_like_path(output) and os.path.exists(output) and not os.path.isdir(output):
        raise ScoringError(f"--output-table {output} is a file, where score writes a folder: name a new path")
    common = dict(run_dir=run_dir, engine=metrics.get("engine"), output=output, held_out=args.rows == "held-out",
                  batch_size=args.batch_size, models_per_gpu=args.models_per_gpu)
    if metrics.get("engine") == SPARK_ML_ENGINE:  # its own pipeline, whatever the project's task
        return Scoring(**common, task=SPARK_ML_ENGINE, options=None, stats=None, seed=metrics["seed"], source=None,
                       table=args.table or metrics["table"]), args.local
    staged = StagedData.load(os.path.join(run_dir, STAGING_DIR))
    if staged.task != args.task:
        raise ScoringError(f"the run in {run_dir} trained the task {staged.task}, not {args.task}: score with that "
                           f"task's project (or --task {staged.task})")
    model = os.path.join(run_dir, MODEL_FILE)
    if not os.path.exists(model):
        raise ScoringError(f"{run_dir} has no {MODEL_FILE}: an older version of the project trained it; train a new "
                           "run (another --output-dir) to score with")
    task = load_task(staged.task)
    if missing := task.lacks(SCORING):
        raise TaskError(f"the task module {staged.task} lacks {', '.join(missing)}, which scoring needs: see "
                        "task_interface.py")
    options = task_options(task, staged.recipe["task_options"])
    try:  # here, not first in a Spark job
        _load(task, model, options, staged.stats, "cpu")
    except Exception as error:  # torch's, in many shapes: a file cut short or overwritten, another model's weights
        raise ScoringError(f"{model} does not load ({type(error).__name__}: {str(error).strip().splitlines()[0]}): "
                           f"it is damaged, or not a model of {staged.task}; train the run again to score") from None
    return Scoring(**common, task=staged.task, options=options, stats=staged.stats, seed=staged.recipe["seed"],
                   table=args.table or staged.source, source=staged.recipe), args.local


def run_folder_of(model: str) -> str:
    """RUN_DIR, or the folder of the run that logged an MLflow model: runs:/ID/..., models:/NAME/VERSION or @ALIAS."""
    if not model.startswith(("runs:/", "models:/")):
        return os.path.abspath(model)
    import mlflow

    try:
        run_id = model.split("/")[1] if model.startswith("runs:/") else mlflow.models.get_model_info(model).run_id
        return mlflow.get_run(run_id).data.params["output_dir"]
    except Exception as error:  # MLflow's, in many shapes (no such model or run, no access); KeyError: an older run's
        raise ScoringError(f"--model {model}: its run's folder is unknown ({type(error).__name__}: "
                           f"{str(error).splitlines()[0]}): give a model version that exists where MLFLOW_TRACKING_URI "
                           "points, or the run's folder") from None


def main(argv: list[str] | None = None) -> int:
    try:
        scoring, local = parse(sys.argv[1:] if argv is None else argv)
    except (ScoringError, TaskError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        spark = _session(scoring, local)
    except Exception as error:  # pyspark reports a missing Java or a port it cannot bind in many shapes
        print(f"error: could not start Spark ({str(error).splitlines()[0]}): --local needs Java 17 or newer",
              file=sys.stderr)
        return 1
    try:
        rows = write(scored(spark, scoring), scoring.output)
    except (ScoringError, TableError, *spark_errors()) as error:
        ours = isinstance(error, (ScoringError, TableError))
        print(f"error: {error if ours else f'scoring {scoring.table!r} failed: {cause(error)}'}", file=sys.stderr)
        return 1
    finally:
        if local:
            spark.stop()
    seconds = time.perf_counter() - started
    print(f"Scored {rows:,} rows of {scoring.table} with the model of {scoring.run_dir} into {scoring.output} "
          f"in {seconds:.1f} s ({rows / seconds:,.0f} rows/s)")
    return 0


def score_main() -> None:
    sys.exit(main())


def _session(scoring: Scoring, local: bool):
    if local:
        from .engines.local_spark import local_spark_session

        return local_spark_session(2, os.path.join(scoring.run_dir, "spark-warehouse"))
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


def scored(spark, scoring: Scoring):
    if scoring.engine == SPARK_ML_ENGINE:
        from .engines.spark_ml_connect import DEFAULT_TABLE, PREDICTION, scored_by_pipeline

        table = read_table(spark, scoring.table, DEFAULT_TABLE)
        score_rows, outputs = functools.partial(scored_by_pipeline, scoring=scoring), [PREDICTION]
    else:
        task = load_task(scoring.task)
        table = read_table(spark, scoring.table, task.DEFAULT_TABLE)
        if scoring.held_out and fingerprint(spark, scoring.table, table) != scoring.source["fingerprint"]:
            then = scoring.source["fingerprint"]["of"]
            raise ScoringError(f"{scoring.table} changed since the run staged it ({then} then): its held-out rows "
                               "cannot be split out again; score --rows all")
        score_rows = functools.partial(scored_by_model, task=task, scoring=scoring)
        outputs = [declared.split()[0] for declared in task.SCORES.split(",")]
    return score_rows(table) if scoring.held_out else every_row_once(table, score_rows, outputs)


def every_row_once(table, score_rows, outputs: list[str]):
    """Each row scored, joined back by a key of its content (two reads agree on it, not on a row number)."""
    keyed = table.withColumn(ROW, row_key(table))
    scores = score_rows(keyed, keep=(ROW,)).select(ROW, *outputs).dropDuplicates([ROW])
    return keyed.join(scores, ROW, "left").select(*[name for name in table.columns if name not in outputs], *outputs)


def row_key(table):
    """Two seeded 64-bit hashes of a row (maps as JSON: Spark hashes none): a billion rows collide with odds < 1e-20."""
    from pyspark.sql import functions as F

    values = [F.to_json(column(name)) if "map<" in kind else column(name) for name, kind in table.dtypes]
    return F.array(F.xxhash64(F.lit(0), *values), F.xxhash64(F.lit(1), *values))


def scored_by_model(table, task, scoring: Scoring, keep=()):
    try:
        rows = task.prepare(table, scoring.options, keep=keep)
    except ValueError as error:
        raise TableError(f"{scoring.table!r}: {error}") from None
    rows = split(rows, scoring.seed)[1] if scoring.held_out else rows
    gpus = shared_gpus(table.sparkSession)
    if gpus:  # as many tasks as models the node's GPUs are to hold: each worker that runs one loads a model
        rows = rows.repartition(gpus * scoring.models_per_gpu)
    arguments = (scoring.run_dir, scoring.task, scoring.options, scoring.stats, scoring.batch_size, gpus)
    return rows.mapInPandas(lambda batches: score_batches(batches, *arguments),
                            f"{', '.join(f'`{name}` {kind}' for name, kind in rows.dtypes)}, {task.SCORES}")


def shared_gpus(spark) -> int:
    """One node's GPUs, which local mode shares by partition (it schedules none); 0 where Spark gives a task its own."""
    if spark.conf.get("spark.master", "local").startswith("local"):
        import torch

        return torch.cuda.device_count()
    executor_gpus, task_gpus = (float(spark.conf.get(f"spark.{kind}.resource.gpu.amount", "0") or 0)
                                for kind in ("executor", "task"))
    if executor_gpus and not task_gpus:
        raise ScoringError("the executors have GPUs, but Spark gives none to a task (spark.task.resource.gpu.amount "
                           "is 0): every Python worker would load a model onto a GPU of its choosing. Score on a "
                           "cluster with spark.task.resource.gpu.amount 1 (the score job's), or on one node")
    return 0


def gpu_of(context, gpus: int) -> int | None:
    assigned = context.resources().get("gpu") if context else None
    if assigned and assigned.addresses:
        return int(assigned.addresses[0])
    return context.partitionId() % gpus if gpus and context else None


def score_batches(batches, run_dir: str, task_module: str, options, stats: dict, batch_size: int, gpus: int = 0):
    import pandas as pd
    import torch
    from pyspark import TaskContext

    task = load_task(task_module)
    path = os.path.join(run_dir, MODEL_FILE)
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _models:
        gpu = gpu_of(TaskContext.get(), gpus)
        device = torch.device("cuda", gpu) if gpu is not None and torch.cuda.is_available() else torch.device("cpu")
        _models[key] = _load(task, path, options, stats, device)
    model, device = _models[key]
    low_precision = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    for batch in batches:
        for start in range(0, len(batch), batch_size):
            rows = batch.iloc[start:start + batch_size].reset_index(drop=True)
            with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=low_precision):
                outputs = task.score(model, rows, stats, options)
            yield pd.concat([rows, pd.DataFrame(outputs)], axis=1)


def _load(task, path: str, options, stats: dict, device):
    import torch

    model = task.build_model(stats, options)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.to(device).eval(), device


def write(rows, output: str) -> int:
    if not looks_like_path(output):
        rows.write.mode("overwrite").option("overwriteSchema", "true").saveAsTable(output)
        return rows.sparkSession.table(output).count()
    write_folder_atomically(output, rows.write.parquet)
    return rows.sparkSession.read.parquet(output).count()
