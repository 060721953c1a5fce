"""The driver of a GPU cluster with workers only coordinates: no engine trains on it there (TorchDistributor and
DeepSpeed run local_mode=False, one process per executor GPU; Ray on Spark's head node offers no GPU to tasks,
ray.util.spark setup_ray_cluster's num_gpus_head_node, 0 off global mode). The template gives it the smallest GPU
size of the workers' family (Databricks docs "GPU-enabled compute": the driver and worker types must be GPU instance
types), so the GPU model, which decides the precision, is the workers'; and `train` takes GPUs per node from a
worker, not from the driver."""

from __future__ import annotations

import pytest

from distributed_training import config as configuration
from distributed_training.compute.catalog import default_catalog
from distributed_training.compute.preflight import EXECUTOR_GPUS_CONF, WORKERS_CONF
from distributed_training.engines import available
from distributed_training.launch import resolve
from distributed_training.tooling.cluster_specs import coordinating_driver, new_cluster

from support.cluster_sessions import cluster_session


def test_every_gpu_family_gets_its_smallest_gpu_size_as_driver():
    catalog = default_catalog()
    for node in catalog.node_types:
        driver = coordinating_driver(node.id)
        family = [kin for kin in catalog.family(node.family) if kin.has_gpu]
        smallest = min(family, key=lambda kin: (kin.gpus, kin.vcpus, kin.memory_gb)) if node.has_gpu else None
        if not node.has_gpu or smallest is node:
            assert driver is None, node.id  # the default: a driver of the workers' type
        else:
            assert driver == smallest.id and catalog.find(driver).gpu_model == node.gpu_model, node.id
    assert {node: coordinating_driver(node) for node in ("g5.48xlarge", "Standard_NC96ads_A100_v4", "a3-highgpu-8g",
                                                        "p5.48xlarge", "m5d.2xlarge", "not-a-node-type")} == {
        "g5.48xlarge": "g5.xlarge", "Standard_NC96ads_A100_v4": "Standard_NC24ads_A100_v4",
        "a3-highgpu-8g": "a3-highgpu-1g", "p5.48xlarge": None, "m5d.2xlarge": None, "not-a-node-type": None}


@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed", "ray"])
def test_only_multi_node_gpu_clusters_name_a_driver(engine):
    def driver(node_type_id, workers):
        return new_cluster(engine, "aws", node_type_id, workers, "17.3.x-scala2.13").get("driver_node_type_id")

    assert (driver("g5.12xlarge", 2), driver("g5.12xlarge", 0), driver("p4d.24xlarge", 2)) == ("g5.xlarge", None, None)


def test_gpus_per_node_come_from_a_worker_on_a_cluster_with_workers_and_from_the_driver_on_one_node():
    """`train` without --gpus-per-node: on a cluster with workers each executor's GPUs (Databricks sets
    spark.executor.resource.gpu.amount to a worker's), whatever the driver has (none on this machine)."""
    def resolved(workers: str, *more):
        argv = ["--engine", "torch_distributor", "--table", "main.default.trips", "--output-dir", "/Volumes/c/s/v/run",
                *more]
        conf = {"spark.master": "spark://10.0.0.1:7077", WORKERS_CONF: workers, EXECUTOR_GPUS_CONF: "4"}
        return resolve(configuration.from_args(argv, available()), None, cluster_session(conf))

    assert resolved("2", "--num-nodes", "2").gpus_per_node == 4
    assert resolved("0").gpus_per_node == 0  # no workers: the driver's own GPUs
    assert resolved("2", "--num-nodes", "2", "--gpus-per-node", "2").gpus_per_node == 2  # the job's word counts
