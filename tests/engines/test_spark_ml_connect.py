"""Spark ML for real: `train --engine spark_ml_connect --local` on a local Spark Connect server.

Each run is a fresh interpreter (the Connect server starts its own JVM); the two APIs' runs start together, as two
local runs on one machine may, and each must find its own server. Spark ML keeps its own tabular pipeline,
the fare of taxi trips, whatever the project's task; it is held to the torch engines' fare bar: a held-out RMSE at
least 3 times below predicting the training mean (2.5 times for gradient-boosted trees).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from distributed_training.launch import main

from conftest import FARE, LANGUAGE, metrics_of, output_of, train_command

# Trees cannot extrapolate a fare that grows with distance: the longest held-out trips lie beyond their last split.
TREES_BETTER_THAN_THE_MEAN = 2.5


def assert_beats_the_mean(metrics: dict, factor: float = 3.0) -> None:
    final = metrics["final"]
    assert final["test_rmse"] * factor < final["baseline_rmse"], final
    assert metrics["held_out_loss"] < metrics["baseline_loss"] / factor ** 2, metrics


@pytest.fixture(scope="module")
def runs_at_once(tmp_path_factory):
    """Each API's run, both started at the same moment: {api: (output folder, completed run)}."""
    runs = {"connect": (LANGUAGE,), "classic": (FARE, "--spark-ml-api", "classic", "--spark-ml-model", "gbt")}
    folders = {api: tmp_path_factory.mktemp(api) for api in runs}
    with ThreadPoolExecutor(len(runs)) as pool:
        started = {api: pool.submit(train_command, folders[api], "spark_ml_connect", task, *options)
                   for api, (task, *options) in runs.items()}
    for api, run in started.items():
        assert run.result().returncode == 0, f"{api}: {output_of(run.result())}"
    return {api: (folders[api], run.result()) for api, run in started.items()}


@pytest.mark.engine
def test_the_pyspark_ml_connect_pipeline_learns_the_fare_whatever_the_task(spark, runs_at_once):
    """A causal-LM project's Spark ML job trains the same tabular pipeline, on its own sample of trips."""
    tmp_path, completed = runs_at_once["connect"]
    assert "Spark ML over Spark Connect, connect API (pyspark.ml.connect), linear regression" in completed.stdout
    assert "shaped like samples.nyctaxi.trips" in completed.stdout
    metrics = metrics_of(tmp_path)
    assert_beats_the_mean(metrics)

    import pandas as pd
    from pyspark.ml.connect.pipeline import PipelineModel

    trips = pd.DataFrame({"trip_distance": [1.0, 3.0, 8.0], "duration_minutes": [6.0, 16.0, 41.0],
                          "pickup_hour": [12.0] * 3, "pickup_weekday": [3.0] * 3})
    fares = PipelineModel.loadFromLocal(str(tmp_path / "model")).transform(trips)["prediction"].tolist()
    assert 2.5 < fares[0] < fares[1] < fares[2] < 60, fares  # the saved pipeline prices trips without Spark
    # `score` on the run's held-out rows, split again from the same table: the run's own held-out RMSE
    from distributed_training import scoring

    held_out = scoring.parse(["--model", str(tmp_path), "--task", LANGUAGE, "--rows", "held-out"])[0]
    scored = scoring.scored(spark, held_out).select("fare_amount", "prediction").toPandas()
    assert len(scored) == metrics["final"]["test_rows"]
    rmse = float(((scored["prediction"] - scored["fare_amount"]) ** 2).mean() ** 0.5)
    assert rmse == pytest.approx(metrics["final"]["test_rmse"], rel=1e-6)
    # Every row of the table once, each prediction the pipeline's for that row's own features, null where the
    # features drop the row
    from distributed_training.engines.spark_ml_connect import FEATURES, features

    everything = scoring.scored(spark, scoring.parse(["--model", str(tmp_path), "--task", LANGUAGE])[0])
    table = spark.read.parquet(metrics["table"])
    assert everything.columns == [*table.columns, "prediction"] and everything.count() == table.count()
    kept = features(everything, keep=("prediction",)).toPandas()
    assert len(kept) == features(table).count() == everything.where("prediction IS NOT NULL").count()
    own = PipelineModel.loadFromLocal(str(tmp_path / "model")).transform(kept[list(FEATURES)])["prediction"]
    assert np.allclose(own, kept["prediction"], rtol=1e-9)

    run_folders = [path.parent.parent for path in (tmp_path / "mlruns").rglob("metrics/test_rmse")]
    assert len(run_folders) == 1, "one MLflow run with the scores"
    assert (run_folders[0] / "artifacts" / "model" / "metadata.json").exists()


@pytest.mark.engine
def test_the_classic_api_offers_more_estimators_over_the_same_connect_session(runs_at_once):
    tmp_path, completed = runs_at_once["classic"]
    assert "Spark ML over Spark Connect, classic API (pyspark.ml), gbt regression" in completed.stdout
    assert_beats_the_mean(metrics_of(tmp_path), TREES_BETTER_THAN_THE_MEAN)
    assert (tmp_path / "model" / "metadata").is_dir() and (tmp_path / "model" / "stages").is_dir()


@pytest.mark.parametrize("options, message", [
    (["--engine", "spark_ml_connect", "--local", "--spark-ml-model", "gbt"],
     "--spark-ml-model gbt is a pyspark.ml estimator, which pyspark.ml.connect lacks: add --spark-ml-api classic"),
    (["--engine", "torch_distributor", "--local", "--spark-ml-api", "classic"],
     "--spark-ml-api configure Spark ML, but the engine is torch_distributor"),
])
def test_spark_ml_options_that_cannot_work_are_refused_before_spark_starts(options, message, capsys):
    assert main([*options, "--task", FARE]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
