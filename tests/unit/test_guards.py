"""The cluster guards, each rule on both sides: a cluster it refuses and one it lets through."""

import pytest

from distributed_training.compute.guards import ClusterRequest, check_bundle_clusters, check_cluster

GPU_ML = "17.3.x-gpu-ml-scala2.13"


def rules(request, severity="error"):
    return sorted({finding.rule for finding in check_cluster(request) if finding.severity == severity})


def request(node="Standard_NC64as_T4_v3", workers=0, version=GPU_ML, engines=("torch_distributor",), **more):
    return ClusterRequest(node_type_id=node, num_workers=workers, spark_version=version, engines=engines, **more)


def test_a_good_single_node_cluster_passes():
    assert check_cluster(request()) == []


@pytest.mark.parametrize("refused, allowed, rule", [
    (request("Standard_NC24s_v3", 2, spark_conf={"spark.task.resource.gpu.amount": "1"}),
     request("Standard_NC24s_v3", 0), "azure-nc-multi-node"),
    (request("Standard_NC64as_T4_v4"), request("Standard_NC64as_T4_v4", allow_unknown_node_type=True),
     "unknown-node-type"),
    (request(cloud="aws"), request(cloud="azure"), "node-type-wrong-cloud"),
    (request(version="17.3.x-cpu-ml-scala2.13"), request(), "gpu-node-cpu-runtime"),
    (request("Standard_D8ds_v5"), request("Standard_D8ds_v5", version="17.3.x-cpu-ml-scala2.13"),
     "gpu-runtime-cpu-node"),
    (request(version="17.3.x-photon-scala2.13"), request(), "photon-on-gpu"),
    (request(runtime_engine="PHOTON"), request(runtime_engine="STANDARD"), "photon-on-gpu"),
    (request(version="12.2.x-gpu-ml-scala2.12"), request(version="13.3.x-gpu-ml-scala2.12"), "runtime-too-old"),
    (request(version="13.3.x-gpu-ml-scala2.12", engines=("deepspeed",)),
     request(version="14.3.x-gpu-ml-scala2.12", engines=("deepspeed",)), "runtime-too-old"),
    (request("m5d.2xlarge", version="16.4.x-scala2.12", engines=("spark_ml_connect",)),
     request("m5d.2xlarge", version="17.3.x-scala2.13", engines=("spark_ml_connect",)), "runtime-too-old"),
    (request(data_security_mode="USER_ISOLATION"), request(data_security_mode="SINGLE_USER"), "ml-on-standard-access"),
    (request("m5d.2xlarge", version="17.3.x-cpu-ml-scala2.13", engines=("deepspeed",)),
     request("g5.12xlarge", engines=("deepspeed",)), "engine-needs-gpu"),
    (request("g5.12xlarge", 2), request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"}),
     "gpu-task-amount"),
    (request("g5.12xlarge", 2, engines=("ray",), spark_conf={"spark.task.resource.gpu.amount": "1"}),
     request("g5.12xlarge", 2, engines=("ray",), spark_conf={"spark.task.resource.gpu.amount": "0"}),
     "gpu-task-amount"),
    (request("Standard_NV72ads_A10_v5"), request("Standard_NV36ads_A10_v5"), "multi-gpu-broken"),
    (request("m5d.2xlarge", version="17.3.x-scala2.13"), request("m5d.2xlarge", version="17.3.x-cpu-ml-scala2.13"),
     "engine-needs-ml-runtime"),
    (request(version="latest"), request(), "unknown-spark-version"),
])
def test_rule_refuses_one_and_allows_the_other(refused, allowed, rule):
    assert rule in rules(refused)
    assert rule not in rules(allowed)


def test_multi_node_on_a_family_with_unproven_networking_is_a_warning():
    cluster = request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"})
    assert rules(cluster) == []
    assert rules(cluster, "warning") == ["multi-node-unproven"]


def test_nc_series_message_names_the_one_node_fix_and_the_accelerated_size():
    [finding] = [f for f in check_cluster(request("Standard_NC12s_v3", 3)) if f.rule == "azure-nc-multi-node"]
    assert "Standard_NC24s_v3" in finding.fix and "Standard_NC64as_T4_v3" in finding.fix
    assert finding.path == "num_workers"


def test_bundle_clusters_are_checked_with_the_engine_of_their_tasks():
    cluster = {"spark_version": "13.3.x-gpu-ml-scala2.12", "node_type_id": "g5.12xlarge", "num_workers": 0}
    task = {"task_key": "t", "job_cluster_key": "gpu",
            "python_wheel_task": {"package_name": "p", "entry_point": "train", "parameters": ["--engine", "deepspeed"]}}
    tree = {"resources": {"jobs": {"train": {"job_clusters": [{"job_cluster_key": "gpu", "new_cluster": cluster}],
                                             "tasks": [task]}}}}
    [finding] = check_bundle_clusters(tree)
    assert finding.rule == "runtime-too-old"
    assert finding.path == "resources.jobs.train.job_clusters[0].new_cluster.spark_version"


def test_unresolved_references_are_left_to_the_resolver():
    assert check_cluster(request("${var.node_type}", version="${var.spark_version}")) == []


@pytest.mark.parametrize("tree", [
    {"resources": ["not", "a", "mapping"]},
    {"resources": {"jobs": {"train": {"tasks": "t", "job_clusters": [{"new_cluster": {"spark_conf": "x"}}]}}}},
    {"resources": {"jobs": {"train": {"job_clusters": [{"new_cluster": {"custom_tags": ["x"], "autoscale": 3,
                                                                        "node_type_id": "g5.xlarge"}}]}}}},
])
def test_malformed_trees_give_findings_not_crashes(tree):
    assert all(finding.rule for finding in check_bundle_clusters(tree))
