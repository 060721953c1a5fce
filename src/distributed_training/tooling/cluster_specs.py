"""Job cluster specs (the `new_cluster` of a bundle's job) built from the template's answers.

The form Databricks' docs show now: `kind: CLASSIC_PREVIEW`, the plain runtime key, `use_ml_runtime: true` for the
ML engines (Databricks picks the GPU or CPU flavour from the node type), and `is_single_node: true` for one node
(Databricks then sets the single-node profile, master and tag itself). Dedicated access for ML and GPUs, Standard for
Spark ML on the standard runtime. See compute/versions.yaml.
"""

from __future__ import annotations

from ..compute.catalog import Catalog, default_catalog
from ..compute.guards import OVERRIDE_TAG
from ..compute.requirements import REQUIREMENTS, SPARK_ML_CONNECT
from ..compute.runtime import parse_runtime, versions

# On-demand capacity: a preempted spot node kills every process of a distributed training run.
ON_DEMAND = {
    "azure": {"azure_attributes": {"availability": "ON_DEMAND_AZURE"}},
    "aws": {"aws_attributes": {"availability": "ON_DEMAND", "first_on_demand": 1}},
    "gcp": {"gcp_attributes": {"availability": "ON_DEMAND_GCP"}},
}


def default_spark_version(engine: str) -> str:
    return versions()["runtime"]


def new_cluster(engine: str, cloud: str, node_type_id: str, num_workers: int, spark_version: str,
                allow_unknown_node_type: bool = False) -> dict:
    """The `new_cluster` mapping for one engine's job: runtime, access mode, single node or not, GPU scheduling."""
    runtime = parse_runtime(spark_version)
    ml_engine = engine != SPARK_ML_CONNECT
    access = "dedicated" if ml_engine or (runtime is not None and runtime.ml) else "standard"
    cluster: dict = {"kind": versions()["kind"], "spark_version": spark_version, "node_type_id": node_type_id}
    if ml_engine:
        cluster["use_ml_runtime"] = True
    if num_workers == 0:
        cluster["is_single_node"] = True
    else:
        cluster["num_workers"] = num_workers
        driver = coordinating_driver(node_type_id)
        if driver is not None:
            cluster["driver_node_type_id"] = driver
    cluster.update({"data_security_mode": versions()["access_modes"][access], "runtime_engine": "STANDARD",
                    **ON_DEMAND[cloud]})
    gpu_amount = REQUIREMENTS[engine].task_gpu_amount
    node = default_catalog().find(node_type_id)
    if num_workers > 0 and gpu_amount is not None and node is not None and node.has_gpu:
        cluster["spark_conf"] = {"spark.task.resource.gpu.amount": gpu_amount}
    if allow_unknown_node_type:
        cluster["custom_tags"] = {OVERRIDE_TAG: "true"}
    return cluster


def coordinating_driver(node_type_id: str, catalog: Catalog | None = None) -> str | None:
    """The driver of a cluster of GPU workers: the smallest GPU node of the workers' own family, or None where that is
    the workers' type (the default) or the type is not in the catalog.

    With workers, even one, no engine trains on the driver: TorchDistributor and DeepSpeed run with local_mode=False,
    one process per executor GPU (Databricks docs "Distributed training with TorchDistributor"); Ray on Spark's head
    node runs there with no CPU or GPU for tasks, and Ray Train's workers on the worker nodes (ray.util.spark
    setup_ray_cluster, num_gpus_head_node); Spark ML is CPU. It coordinates, so a full GPU node there idles. It keeps
    a GPU (Databricks docs "GPU-enabled compute": the driver and worker types must be GPU instance types, and
    compute/guards.py refuses a CPU driver on AWS), of the workers' model: precision is chosen from the driver's GPU
    (launch.py)."""
    catalog = catalog or default_catalog()
    node = catalog.find(node_type_id)
    if node is None or not node.has_gpu:
        return None
    smallest = min((kin for kin in catalog.family(node.family) if kin.has_gpu),
                   key=lambda kin: (kin.gpus, kin.vcpus, kin.memory_gb))
    return smallest.id if smallest.id != node.id else None


def gpus_per_node(node_type_id: str, catalog: Catalog | None = None) -> int:
    node = (catalog or default_catalog()).find(node_type_id)
    return node.gpus if node else 0


def databricks_connect_version(spark_version: str) -> str:
    """The databricks-connect release line that matches a runtime: 17.3.x-scala2.13 -> 17.3.*."""
    runtime = parse_runtime(spark_version)
    if runtime is None:
        raise ValueError(f"spark_version {spark_version!r} is not a Databricks Runtime version")
    return f"{runtime.major}.{runtime.minor}.*"
