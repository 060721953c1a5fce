"""Spark ML for real: `train --engine spark_ml_connect --local` on a local Spark Connect server (remote("local[2]")).

Each run is a fresh interpreter (the Connect server starts its own JVM, and this process may already hold the
classic `spark` fixture's). The pipelines train on the same sample table as the torch engines and are held to the
same bar: a held-out RMSE at least 3 times below predicting the training mean (2.5 times for gradient-boosted trees). They are scored on the rows the torch
engines hold out, which the staging of the same table (by the classic session) shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.cli import main
from distributed_training.training.staging import stage_training_data

SOURCE = Path(__file__).resolve().parents[2] / "src"
BETTER_THAN_THE_MEAN = 3.0
# Trees cannot extrapolate a fare that grows with distance: the longest held-out trips lie beyond their last split.
TREES_BETTER_THAN_THE_MEAN = 2.5


def train_spark_ml(output_dir: Path, *options: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    environment.pop("MLFLOW_TRACKING_URI", None)  # --local then tracks into OUTPUT_DIR/mlruns
    completed = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", "--engine", "spark_ml_connect", "--local",
         "--output-dir", str(output_dir), *options],
        capture_output=True, text=True, env=environment, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed


def assert_beats_the_mean(metrics: dict, factor: float = BETTER_THAN_THE_MEAN) -> None:
    final = metrics["final"]
    assert final["test_rmse"] * factor < final["baseline_rmse"], final
    assert final["test_mae"] < final["test_rmse"], final


def assert_the_saved_pipeline_prices_trips_without_spark(saved: Path) -> None:
    """pyspark.ml.connect models also transform pandas DataFrames: the saved pipeline loads and prices trips."""
    import pandas as pd
    from pyspark.ml.connect.pipeline import PipelineModel

    trips = pd.DataFrame({"trip_distance": [1.0, 3.0, 8.0], "duration_minutes": [8.0, 18.0, 35.0],
                          "pickup_hour_sin": [0.5] * 3, "pickup_hour_cos": [0.0] * 3,
                          "pickup_weekday_sin": [0.4] * 3, "pickup_weekday_cos": [0.9] * 3})
    fares = PipelineModel.loadFromLocal(str(saved)).transform(trips)["prediction"].tolist()
    assert 2.5 < fares[0] < fares[1] < fares[2] < 60, fares


@pytest.mark.engine
def test_the_pyspark_ml_connect_pipeline_learns_the_fare_on_the_torch_engines_split(spark, tmp_path):
    completed = train_spark_ml(tmp_path)
    assert "Spark ML over Spark Connect, connect API (pyspark.ml.connect), linear regression" in completed.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert_beats_the_mean(metrics)

    staged = stage_training_data(spark, str(tmp_path / "sample_trips"), str(tmp_path / "staging"), world_size=2,
                                 seed=42)
    assert (metrics["train_rows"], metrics["test_rows"]) == (staged.train_rows, staged.test_rows)

    saved = tmp_path / "model"
    assert list(saved.glob("*.LeastSquaresModel.json"))
    assert_the_saved_pipeline_prices_trips_without_spark(saved)
    run_folders = [path.parent.parent for path in (tmp_path / "mlruns").rglob("metrics/test_rmse")]
    assert len(run_folders) == 1, "one MLflow run with the scores"
    assert (run_folders[0] / "artifacts" / "model" / "metadata.json").exists()
    assert (run_folders[0] / "artifacts" / "metrics.json").exists()


@pytest.mark.engine
def test_the_classic_api_offers_more_estimators_over_the_same_connect_session(tmp_path):
    completed = train_spark_ml(tmp_path, "--spark-ml-api", "classic", "--spark-ml-model", "gbt")
    assert "Spark ML over Spark Connect, classic API (pyspark.ml), gbt regression" in completed.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert_beats_the_mean(metrics, TREES_BETTER_THAN_THE_MEAN)
    assert (tmp_path / "model" / "metadata").is_dir() and (tmp_path / "model" / "stages").is_dir()


@pytest.mark.parametrize("options, message", [
    (["--engine", "spark_ml_connect", "--local", "--spark-ml-model", "gbt"],
     "--spark-ml-model gbt is a pyspark.ml estimator, which pyspark.ml.connect lacks: add --spark-ml-api classic"),
    (["--engine", "torch_distributor", "--local", "--spark-ml-api", "classic"],
     "--spark-ml-api configure Spark ML, but the engine is torch_distributor"),
])
def test_spark_ml_options_that_cannot_work_are_refused_before_spark_starts(options, message, capsys):
    assert main(["train", *options]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
