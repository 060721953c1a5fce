"""Train a Spark ML pipeline over Spark Connect: the platform's way to train classic ML models on a Databricks Runtime
17.0+ cluster with Standard access (CPU nodes; Spark ML uses no GPU).

Spark ML keeps its own tabular pipeline, whatever the project's task: a taxi trip's fare from its distance, its
duration and the hour and day it started, on `samples.nyctaxi.trips` (every workspace has it). Held-out scores are
stated against predicting the training mean, as the torch engines state theirs. Two APIs:
- `connect` (default), `pyspark.ml.connect`: the module the platform offers for Spark ML over Spark Connect. It has no
  regressor of its own (only LogisticRegression), so the model is `least_squares.LeastSquaresRegressor`. Its evaluator
  needs torcheval (and so torch) on the driver and the executors.
- `classic`, `pyspark.ml` over Spark Connect (Spark 4): the full MLlib, trained on the server: linear regression,
  gradient-boosted trees or a random forest. The only one on Standard compute, whose runtime has no torch.

The session is the driver's own on a cluster; with --local a Spark Connect server of its own, on a free port. The
fitted pipeline is saved to OUTPUT_DIR/model and, with MLflow, logged with the run's params and scores.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from ..config import Config
from ..data.staging import read_table, split
from ..files import write_json
from ..training.tracking import Tracker
from . import WAREHOUSE_DIR, Engine, LaunchError, TrainingRun

DEFAULT_TABLE = "samples.nyctaxi.trips"
FEATURES = ("trip_distance", "duration_minutes", "pickup_hour", "pickup_weekday")
LABEL, RAW_FEATURES, SCALED, PREDICTION = "fare_amount", "raw_features", "features", "prediction"
MODEL_DIR, METRICS_FILE = "model", "metrics.json"
API_MODULES = {"connect": "pyspark.ml.connect", "classic": "pyspark.ml"}


class SparkMLEngine(Engine):
    name = "spark_ml_connect"

    def default_table(self, config: Config) -> str:
        return DEFAULT_TABLE

    def sample_table(self, spark, config: Config):
        """Trips with the default table's columns: a metered fare plus noise, and a few nonsense rows."""
        from pyspark.sql import functions as F

        seconds = (F.rand(config.seed) * 60 * 86400).cast("long")
        distance = F.round(F.exp(F.randn(config.seed + 1) * 0.7 + 0.6), 2)
        minutes = F.col("trip_distance") * 5 + F.rand(config.seed + 2) * 3
        fare = F.round(2.5 + 2.5 * F.col("trip_distance") + 0.35 * minutes + F.randn(config.seed + 3), 1)
        return (spark.range(4000)
                .withColumn("tpep_pickup_datetime", F.timestamp_seconds(F.lit(1451606400) + seconds))
                .withColumn("trip_distance", distance)
                .withColumn("tpep_dropoff_datetime", F.timestamp_seconds(F.unix_timestamp("tpep_pickup_datetime")
                                                                         + (minutes * 60).cast("long")))
                .withColumn("fare_amount", F.when(F.col("id") % 50 == 0, -1.0).otherwise(fare))
                .drop("id"))

    def local_session(self, config: Config):
        """A Spark Connect session on a local server of its own, started as pyspark's remote("local[N]") starts one
        but on a free port: pyspark's is always 15002, where a second local run on the machine would meet the first's
        server (or fail to start its own)."""
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        from .local_spark import local_spark_session

        os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", uuid.uuid4().hex)  # the server's, and the client's
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        local_spark_session(max(config.placement.world_size, 2), os.path.join(config.output_dir, WAREHOUSE_DIR),
                            conf={"spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
                                  "spark.connect.grpc.binding.address": "127.0.0.1",
                                  "spark.connect.grpc.binding.port": str(port)})
        os.environ.update(SPARK_CONNECT_MODE_ENABLED="1", SPARK_LOCAL_REMOTE="1")  # as pyspark marks a local server
        return ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate()

    def train(self, spark, config: Config, environment: dict[str, str]) -> TrainingRun:
        """Split the table, fit the pipeline on the training rows, score the held-out rows."""
        from pyspark.sql import functions as F

        started = time.perf_counter()
        api, model_name = config.spark_ml_api or "connect", config.spark_ml_model or "linear"
        description = f"Spark ML over Spark Connect, {api} API ({API_MODULES[api]}), {model_name} regression"
        train_rows, test_rows = split(features(read_table(spark, config.table, DEFAULT_TABLE)), config.seed)
        train_rows = train_rows.cache()
        tracker = Tracker(config, is_main=True, environment=environment)
        try:
            summary = train_rows.agg(F.count(F.lit(1)).alias("rows"), F.avg(LABEL).alias("mean")).first()
            if not summary["rows"]:
                raise LaunchError(f"{config.table!r} leaves no training rows after dropping nonsense rows: train on "
                                  "a larger table")
            params = {"engine": config.engine, "api": api, "model": model_name, "source": config.table,
                      "train_rows": summary["rows"], "seed": config.seed, "output_dir": config.output_dir}
            run_id = tracker.start(params, resumed_run_id=None)
            print(f"fitting the {api} pipeline ({model_name}) on {summary['rows']} training rows", flush=True)
            fitted = pipeline(api, model_name, config.seed).fit(train_rows)
            scores = evaluate(api, fitted.transform(test_rows), float(summary["mean"]))
            model_dir = os.path.join(config.output_dir, MODEL_DIR)
            if api == "connect":
                fitted.saveToLocal(model_dir, overwrite=True)  # a pyspark.ml.connect model lives on the driver
            else:
                fitted.write().overwrite().save(model_dir)  # saved by the server (a volume path on a cluster)
            metrics = {"engine": config.engine, "api": api, "model": model_name, "train_rows": int(summary["rows"]),
                       "table": config.table, "seed": config.seed,
                       "held_out_loss": scores["held_out_loss"], "baseline_loss": scores["baseline_loss"],
                       "final": scores, "seconds": round(time.perf_counter() - started, 2), "model_dir": model_dir,
                       "metrics_file": os.path.join(config.output_dir, METRICS_FILE), "mlflow_run_id": run_id}
            write_json(metrics["metrics_file"], metrics)
            tracker.log_step(1, scores)
            tracker.log_file(metrics["metrics_file"])
            tracker.log_folder(model_dir, MODEL_DIR)
        except BaseException:
            tracker.finish(succeeded=False)
            raise
        finally:
            train_rows.unpersist()
        tracker.finish(succeeded=True)
        return TrainingRun(description, metrics)


def features(trips, keep=()):
    """One row per sensible trip: the features and the fare, as doubles (and the columns `keep`, as they are)."""
    from pyspark.sql import functions as F

    missing = [name for name in ("tpep_pickup_datetime", "tpep_dropoff_datetime", "trip_distance", LABEL)
               if name not in trips.columns]
    if missing:
        raise LaunchError(f"Spark ML trains on taxi trips, and the table lacks {', '.join(missing)}: pass --table "
                          f"with a table shaped like {DEFAULT_TABLE}")
    pickup = F.col("tpep_pickup_datetime")
    minutes = (F.unix_timestamp("tpep_dropoff_datetime") - F.unix_timestamp(pickup)) / 60.0
    trips = trips.select(F.col("trip_distance").cast("double"), minutes.alias("duration_minutes"),
                         F.hour(pickup).cast("double").alias("pickup_hour"),
                         F.dayofweek(pickup).cast("double").alias("pickup_weekday"),
                         F.col(LABEL).cast("double"), *keep).dropna()
    return trips.where((F.col(LABEL) > 0) & (F.col(LABEL) <= 250) & (F.col("trip_distance") > 0)
                       & (F.col("trip_distance") <= 100) & (F.col("duration_minutes") > 0)
                       & (F.col("duration_minutes") <= 180))


def scored_by_pipeline(table, scoring, keep=()):
    """`score` with a run's fitted pipeline: the sensible trips (held out, or all) with their predicted fares."""
    with open(os.path.join(scoring.run_dir, METRICS_FILE)) as file:
        api = json.load(file)["api"]
    if api == "connect":
        from pyspark.ml.connect.pipeline import PipelineModel

        fitted = PipelineModel.loadFromLocal(os.path.join(scoring.run_dir, MODEL_DIR))
    else:
        from pyspark.ml import PipelineModel

        fitted = PipelineModel.load(os.path.join(scoring.run_dir, MODEL_DIR))
    rows = features(table, keep)
    rows = split(rows, scoring.seed)[1] if scoring.held_out else rows
    return fitted.transform(rows).drop(RAW_FEATURES, SCALED)


def pipeline(api: str, model: str, seed: int):
    """Assemble the features, scale them to mean 0 and variance 1, regress the fare."""
    if api == "connect":
        from pyspark.ml.connect.feature import ArrayAssembler, StandardScaler
        from pyspark.ml.connect.pipeline import Pipeline

        from .least_squares import LeastSquaresRegressor

        return Pipeline(stages=[
            ArrayAssembler(inputCols=list(FEATURES), outputCol=RAW_FEATURES, featureSizes=[1] * len(FEATURES)),
            StandardScaler(inputCol=RAW_FEATURES, outputCol=SCALED),
            LeastSquaresRegressor(featuresCol=SCALED, labelCol=LABEL, predictionCol=PREDICTION),
        ])
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml.regression import GBTRegressor, LinearRegression, RandomForestRegressor

    columns = {"featuresCol": SCALED, "labelCol": LABEL, "predictionCol": PREDICTION}
    regressor = {"linear": lambda: LinearRegression(**columns),
                 "gbt": lambda: GBTRegressor(maxDepth=5, seed=seed, **columns),
                 "random_forest": lambda: RandomForestRegressor(numTrees=50, maxDepth=8, seed=seed, **columns)}[model]
    return Pipeline(stages=[VectorAssembler(inputCols=list(FEATURES), outputCol=RAW_FEATURES),
                            StandardScaler(inputCol=RAW_FEATURES, outputCol=SCALED, withMean=True, withStd=True),
                            regressor()])


def evaluate(api: str, predictions, train_mean: float) -> dict:
    """RMSE from the API's own evaluator; MAE and the mean predictor's error from one aggregation. The losses are
    mean squared errors in dollars, the trivial predictor's on the same held-out rows."""
    from pyspark.sql import functions as F

    if api == "connect":
        from pyspark.ml.connect.evaluation import RegressionEvaluator
    else:
        from pyspark.ml.evaluation import RegressionEvaluator
    rmse = RegressionEvaluator(metricName="rmse", labelCol=LABEL, predictionCol=PREDICTION).evaluate(predictions)
    label, prediction = F.col(LABEL), F.col(PREDICTION)
    row = predictions.agg(F.avg(F.abs(prediction - label)).alias("mae"),
                          F.avg((label - F.lit(train_mean)) ** 2).alias("baseline_mse"),
                          F.count(F.lit(1)).alias("rows")).first()
    if not row["rows"]:
        raise LaunchError("the held-out split is empty: train on a larger table")
    return {"held_out_loss": float(rmse) ** 2, "baseline_loss": float(row["baseline_mse"]), "test_rmse": float(rmse),
            "test_mae": float(row["mae"]), "baseline_rmse": float(row["baseline_mse"]) ** 0.5,
            "test_rows": int(row["rows"])}


ENGINE = SparkMLEngine()
