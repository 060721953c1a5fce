"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A real local Spark session (master local[2]) for the whole test session, stopped at the end.

    Two cores, because distributed tests run two processes; few shuffle partitions, because test data is small;
    its own warehouse folder, so no test writes into the working directory.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter, with its packages
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def render_into():
    """`render_template(output_dir, **answers)`, for fixtures of any scope that need a project of their own."""
    from support.rendering import render_template

    return render_template


@pytest.fixture(autouse=True)
def mlflow_uris_restored():
    """MLflow's set_tracking_uri and set_registry_uri also export MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, which
    every later test in this process would take for a user's choice: a test that sets them leaves them as it found
    them."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {name: os.environ.get(name) for name in names}
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or all(os.environ.get(name) == before[name] for name in names):
        return
    mlflow.set_tracking_uri(before["MLFLOW_TRACKING_URI"])
    mlflow.set_registry_uri(before["MLFLOW_REGISTRY_URI"])
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
