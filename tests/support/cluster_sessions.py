"""A Databricks cluster's Spark session as `train` reads it on the driver: its Spark confs, the usage tags among them
(the session's runtime conf and its SparkContext's conf both)."""

from __future__ import annotations

from types import SimpleNamespace

from distributed_training.compute.preflight import EXECUTOR_GPUS_CONF, WORKERS_CONF

ONE_WORKER = {"spark.master": "spark://10.0.0.1:7077", WORKERS_CONF: "1", EXECUTOR_GPUS_CONF: "4"}
SINGLE_NODE = {"spark.master": "local[*, 4]", WORKERS_CONF: "0"}


def cluster_session(conf: dict[str, str]):
    spark_context = SimpleNamespace(getConf=lambda: SimpleNamespace(getAll=lambda: [*conf.items()]))
    return SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default)),
                           sparkContext=spark_context)
