"""A local Spark session for `train --local`: this machine's cores, quiet, its warehouse under the run's folder."""

from __future__ import annotations

import os
import sys


# A local run's JVMs live for minutes and run small jobs: C2's compiling and the parallel collector's threads cost more
# CPU than they save (C1 alone and the serial collector take a local run from 36 to 26 CPU seconds on 2 cores).
# Their log4j configuration: errors alone, without the notices Spark's default one prints in every run.
LOCAL_JVM_OPTIONS = (f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                     f'-Dlog4j2.configurationFile="{os.path.join(os.path.dirname(__file__), "local_log4j2.yaml")}"')


def local_spark_session(cores: int, warehouse_dir: str, master: str | None = None,
                        executor_env: dict[str, str] | None = None, conf: dict[str, str] | None = None):
    """`master` defaults to local[cores]; an engine that needs executors of their own passes local-cluster[...],
    and `executor_env` for what those executor processes must see; `conf`: further settings."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local run talks only to itself
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers need this interpreter's packages
    builder = SparkSession.builder.master(master or f"local[{cores}]").appName("distributed-training-local")
    settings = {"spark.sql.shuffle.partitions": str(max(cores, 2)), "spark.sql.warehouse.dir": warehouse_dir,
                "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.driver.extraJavaOptions": LOCAL_JVM_OPTIONS,
                "spark.executor.extraJavaOptions": LOCAL_JVM_OPTIONS,
                **{f"spark.executorEnv.{name}": value for name, value in (executor_env or {}).items()}, **(conf or {})}
    for name, value in settings.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
