"""Train a Spark ML pipeline over Spark Connect (`training.spark_ml`): the platform's way to train classic ML models
on a Databricks Runtime 17.0+ cluster with Standard access (CPU nodes; Spark ML uses no GPU).

The session is the driver's own on a cluster (Spark Connect on Standard access); with `--local` it is a local Spark
Connect server that pyspark starts (`SparkSession.builder.remote("local[N]")`). The pipeline trains on the same
table, features and split as the torch engines and reports the same scores. The fitted pipeline is saved to
OUTPUT_DIR/model and, with MLflow, logged with the run's params and scores; the scores also go to
OUTPUT_DIR/metrics.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import run_options
from .settings import DEFAULT_LOCAL_PROCESSES, LaunchError, RunSettings, TrainingRun

MODEL_DIR = "model"
METRICS_FILE = "metrics.json"
API_MODULES = {"connect": "pyspark.ml.connect", "classic": "pyspark.ml"}


def local_session(settings: RunSettings, warehouse_dir: str):
    """A Spark Connect session on a local server that pyspark starts (and stops with the session)."""
    import warnings

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local run talks only to itself
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the server's Python workers need this interpreter
    cores = max(settings.processes or DEFAULT_LOCAL_PROCESSES, 2)
    builder = (
        SparkSession.builder.remote(f"local[{cores}]")
        .config("spark.sql.warehouse.dir", warehouse_dir)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(cores))
    )
    with warnings.catch_warnings():
        # The static confs reach the server when it starts; pyspark then sets them once more on the session, in vain.
        warnings.filterwarnings("ignore", message=".*CANNOT_MODIFY_CONFIG.*")
        return builder.getOrCreate()


def train(spark, settings: RunSettings) -> TrainingRun:
    """Split the table as the torch engines do, fit the pipeline on the training rows, score the held-out rows."""
    from pyspark.sql import functions as F

    from ..training import spark_ml
    from ..training.staging import split
    from ..training.trips import LABEL_COLUMN, prepare_features, read_trips
    from ..training.tracking import Tracker

    started = time.perf_counter()
    api, model_name = settings.spark_ml_api, settings.spark_ml_model
    description = f"Spark ML over Spark Connect, {api} API ({API_MODULES[api]}), {model_name} regression"
    try:
        train_rows, test_rows = split(prepare_features(read_trips(spark, settings.table)), settings.seed)
    except ValueError as error:  # unreadable table or missing columns: the message says which
        raise LaunchError(str(error)) from None
    train_rows = train_rows.cache()
    tracker = Tracker(run_options.tracking(settings), is_main=True)
    try:
        summary = train_rows.agg(F.count(F.lit(1)).alias("rows"), F.avg(LABEL_COLUMN).alias("label_mean")).first()
        if not summary["rows"]:
            raise LaunchError(f"{settings.table!r} leaves no training rows after dropping nonsense rows: "
                              "train on a larger table")
        params = {"engine": settings.engine, "api": api, "model": model_name, "source": settings.table,
                  "train_rows": summary["rows"], "seed": settings.seed}
        run_id = tracker.start(params, resumed_run_id=None)
        print(f"fitting the {api} pipeline ({model_name}) on {summary['rows']} training rows", flush=True)
        fitted = spark_ml.pipeline(api, model_name, settings.seed).fit(train_rows)
        scores = spark_ml.evaluate(api, fitted.transform(test_rows), float(summary["label_mean"]))
        model_dir = os.path.join(settings.output_dir, MODEL_DIR)
        spark_ml.save(api, fitted, model_dir)
        metrics = {
            "engine": settings.engine, "api": api, "model": model_name,
            "train_rows": int(summary["rows"]), "test_rows": scores["test_rows"], "final": scores,
            "seconds": round(time.perf_counter() - started, 2), "model_dir": model_dir,
            "metrics_file": os.path.join(settings.output_dir, METRICS_FILE), "mlflow_run_id": run_id,
        }
        _write_json(metrics["metrics_file"], metrics)
        tracker.log_epoch(1, scores)
        tracker.log_file(metrics["metrics_file"])
        tracker.log_folder(model_dir, MODEL_DIR)
    except BaseException:
        tracker.finish(succeeded=False)
        raise
    finally:
        train_rows.unpersist()
    tracker.finish(succeeded=True)
    return TrainingRun(description, metrics)


def _write_json(path: str, content: dict) -> None:
    """Whole or not at all. (Not the loop's writer: that module needs torch, which Spark ML does not.)"""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w") as file:
        json.dump(content, file, indent=2)
    os.replace(partial, path)
