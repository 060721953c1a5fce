"""Job cluster specs (the `new_cluster` of a bundle's job) built from the template's answers."""

from __future__ import annotations

from .catalog import Catalog, default_catalog
from .engines import REQUIREMENTS, SPARK_ML_CONNECT
from .guards import OVERRIDE_TAG
from .runtime import parse_runtime

GPU_ML_RUNTIME = "17.3.x-gpu-ml-scala2.13"  # 17.3 LTS ML, Spark 4.0, Python 3.12
STANDARD_RUNTIME = "17.3.x-scala2.13"  # 17.3 LTS: Spark ML through Spark Connect on Standard compute

# On-demand capacity: a preempted spot node kills every process of a distributed training run.
ON_DEMAND = {
    "azure": {"azure_attributes": {"availability": "ON_DEMAND_AZURE"}},
    "aws": {"aws_attributes": {"availability": "ON_DEMAND", "first_on_demand": 1}},
    "gcp": {"gcp_attributes": {"availability": "ON_DEMAND_GCP"}},
}


def default_spark_version(engine: str) -> str:
    return STANDARD_RUNTIME if engine == SPARK_ML_CONNECT else GPU_ML_RUNTIME


def new_cluster(engine: str, cloud: str, node_type_id: str, num_workers: int, spark_version: str,
                allow_unknown_node_type: bool = False) -> dict:
    """The `new_cluster` mapping for one engine's job: runtime, access mode, single-node form, GPU scheduling."""
    runtime = parse_runtime(spark_version)
    standard_access = engine == SPARK_ML_CONNECT and runtime is not None and not runtime.ml
    cluster: dict = {
        "spark_version": spark_version,
        "node_type_id": node_type_id,
        "num_workers": num_workers,
        "data_security_mode": "USER_ISOLATION" if standard_access else "SINGLE_USER",
        "runtime_engine": "STANDARD",
        **ON_DEMAND[cloud],
    }
    spark_conf: dict[str, str] = {}
    custom_tags: dict[str, str] = {}
    if num_workers == 0:
        spark_conf.update({"spark.databricks.cluster.profile": "singleNode", "spark.master": "local[*, 4]"})
        custom_tags["ResourceClass"] = "SingleNode"
    else:
        gpu_amount = REQUIREMENTS[engine].task_gpu_amount
        node = default_catalog().find(node_type_id)
        if gpu_amount is not None and node is not None and node.has_gpu:
            spark_conf["spark.task.resource.gpu.amount"] = gpu_amount
    if allow_unknown_node_type:
        custom_tags[OVERRIDE_TAG] = "true"
    if spark_conf:
        cluster["spark_conf"] = spark_conf
    if custom_tags:
        cluster["custom_tags"] = custom_tags
    return cluster


def gpus_per_node(node_type_id: str, catalog: Catalog | None = None) -> int:
    node = (catalog or default_catalog()).find(node_type_id)
    return node.gpus if node else 0


def databricks_connect_version(spark_version: str) -> str:
    """The databricks-connect release line that matches a runtime: 17.3.x-gpu-ml-scala2.13 -> 17.3.*."""
    runtime = parse_runtime(spark_version)
    if runtime is None:
        raise ValueError(f"spark_version {spark_version!r} is not a Databricks Runtime version")
    return f"{runtime.major}.{runtime.minor}.*"
