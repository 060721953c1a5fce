"""The cluster guards, each rule on both sides: a cluster it refuses and one it lets through.

The same rules run in three places: the template's answer checks (failures/test_bad_answers.py), `validate` on every
cluster of a bundle (here through `bundle.jobs_and_clusters.guard_findings`, and
template/test_guards_on_edited_bundles.py), and the preflight at the start of a run (here, for retired node types).
"""

import sys
import types
from dataclasses import replace

import pytest

from distributed_training.compute import preflight
from distributed_training.compute.catalog import Catalog, default_catalog
from distributed_training.compute.guards import ClusterRequest, check_cluster
from distributed_training.tooling.bundle.jobs_and_clusters import (TRAINING_TAG, clusters_of, guard_findings,
                                                                   jobs_with_tasks, request_from_cluster,
                                                                   training_cluster)

GPU_ML = "17.3.x-gpu-ml-scala2.13"
PLAIN = "17.3.x-scala2.13"  # the key generated clusters carry, with use_ml_runtime: true


def before_the_retirements() -> Catalog:
    """The catalog as it stood before Microsoft retired NCv3 (a project generated then carries this one): the only
    families the catalog refuses multi-node training on are NC-series, and both are retired now, so the multi-node
    rules are reachable only through such a catalog."""
    catalog = default_catalog()
    return Catalog([replace(node, retired=None) for node in catalog.node_types], catalog.defaults)


OLD_CATALOG = before_the_retirements()


def rules(request, severity="error", catalog=None):
    return sorted({finding.rule for finding in check_cluster(request, catalog=catalog) if finding.severity == severity})


def request(node="Standard_NC64as_T4_v3", workers=0, version=GPU_ML, engines=("torch_distributor",), **more):
    return ClusterRequest(node_type_id=node, num_workers=workers, spark_version=version, engines=engines, **more)


def test_a_good_single_node_cluster_passes():
    assert check_cluster(request()) == []
    assert check_cluster(request(version=PLAIN, use_ml_runtime=True)) == []


@pytest.mark.parametrize("refused, allowed, rule", [
    (request("Standard_NC24s_v3"), request("Standard_NC24ads_A100_v4"), "retired-node-type"),
    (request("Standard_NC64as_T4_v4"), request("Standard_NC64as_T4_v4", allow_unknown_node_type=True),
     "unknown-node-type"),
    (request(cloud="aws"), request(cloud="azure"), "node-type-wrong-cloud"),
    (request(version="17.3.x-cpu-ml-scala2.13"), request(), "gpu-node-cpu-runtime"),
    # the plain key is a CPU runtime unless use_ml_runtime asks Databricks for the ML flavour (GPU on a GPU node)
    (request(version=PLAIN), request(version=PLAIN, use_ml_runtime=True), "gpu-node-cpu-runtime"),
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
    (request(data_security_mode="DATA_SECURITY_MODE_STANDARD"),
     request(data_security_mode="DATA_SECURITY_MODE_DEDICATED"), "ml-on-standard-access"),
    (request("m5d.2xlarge", version="17.3.x-cpu-ml-scala2.13", engines=("deepspeed",)),
     request("g5.12xlarge", engines=("deepspeed",)), "engine-needs-gpu"),
    (request("g5.12xlarge", 2), request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"}),
     "gpu-task-amount"),
    (request("g5.12xlarge", 2, engines=("ray",), spark_conf={"spark.task.resource.gpu.amount": "1"}),
     request("g5.12xlarge", 2, engines=("ray",), spark_conf={"spark.task.resource.gpu.amount": "0"}),
     "gpu-task-amount"),
    (request("Standard_NV72ads_A10_v5"), request("Standard_NV36ads_A10_v5"), "multi-gpu-broken"),
    (request("m5d.2xlarge", version=PLAIN), request("m5d.2xlarge", version=PLAIN, use_ml_runtime=True),
     "engine-needs-ml-runtime"),
    (request(version="latest"), request(), "unknown-spark-version"),
    # AWS's GPU docs ask for GPU driver and worker types: an error there (a warning elsewhere, below)
    (request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"}, driver_node_type_id="m5d.xlarge"),
     request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"}, driver_node_type_id="g5.xlarge"),
     "cpu-driver-gpu-workers"),
])
def test_rule_refuses_one_and_allows_the_other(refused, allowed, rule):
    assert rule in rules(refused)
    assert rule not in rules(allowed)


def test_retired_node_type_is_refused_naming_its_retirement_and_current_replacements():
    """Microsoft's NCv3 retirement notice (learn.microsoft.com/azure/virtual-machines/sizes/retirement/
    ncv3-nc6s-nc12s-nc24s-retirement): no cluster of Standard_NC6s/12s/24s_v3 starts after 2025-09-30."""
    catalog = default_catalog()
    for node_type_id in ("Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3", "Standard_NC24rs_v3"):
        [finding] = check_cluster(request(node_type_id), path="c")
        retired = catalog.find(node_type_id).retired
        assert (finding.rule, finding.severity, finding.path) == ("retired-node-type", "error", "c.node_type_id")
        assert retired.date in finding.message and retired.source in finding.message
        assert all(replacement in finding.fix for replacement in retired.replacements)
        assert all(not catalog.find(replacement).retired for replacement in retired.replacements)


def test_a_cpu_driver_beside_gpu_workers_is_a_warning_off_aws():
    cluster = request("Standard_NC64as_T4_v3", 2, spark_conf={"spark.task.resource.gpu.amount": "1"},
                      driver_node_type_id="Standard_D8ds_v5")
    assert rules(cluster) == []
    assert rules(cluster, "warning") == ["cpu-driver-gpu-workers"]
    assert rules(replace(cluster, num_workers=0), "warning") == []  # one node: the driver is the only node


def test_a_driver_of_another_gpu_model_than_the_workers_is_a_warning():
    """launch.py chooses the precision from the driver's GPU: the template's multi-node driver is the smallest size of
    the workers' family (clusters.coordinating_driver); a hand-edited one of another model is named, by validate and
    by the preflight alike."""
    def driver_warnings(driver: str) -> list[str]:
        cluster = request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"},
                          driver_node_type_id=driver)
        return [rule for rule in rules(cluster, "warning") if "driver" in rule]

    assert (driver_warnings("g5.xlarge"), driver_warnings("g4dn.xlarge")) == ([], ["driver-gpu-model"])


def test_multi_node_on_a_family_with_unproven_networking_is_a_warning():
    cluster = request("g5.12xlarge", 2, spark_conf={"spark.task.resource.gpu.amount": "1"})
    assert rules(cluster) == []
    assert rules(cluster, "warning") == ["multi-node-unproven"]


def test_multi_node_on_azure_nc_series_is_refused_where_the_catalog_still_has_it():
    """Databricks' distributed-training docs for Azure: no multi-node training on NC-series (low inter-node network
    performance). Reached through a catalog from before the NCv3 retirement."""
    multi = request("Standard_NC24s_v3", 2, spark_conf={"spark.task.resource.gpu.amount": "1"})
    assert rules(multi, catalog=OLD_CATALOG) == ["azure-nc-multi-node"]
    assert rules(replace(multi, num_workers=0), catalog=OLD_CATALOG) == []
    assert rules(multi) == ["retired-node-type"]  # today's catalog: retired first, nothing else to say


def test_nc_series_message_names_the_one_node_fix_and_the_accelerated_size():
    [finding] = [f for f in check_cluster(request("Standard_NC12s_v3", 3), catalog=OLD_CATALOG)
                 if f.rule == "azure-nc-multi-node"]
    assert "Standard_NC24s_v3" in finding.fix and "Standard_NC64as_T4_v3" in finding.fix
    assert finding.path == "num_workers"


def test_the_generated_cluster_form_reads_back_as_its_request():
    """kind: CLASSIC_PREVIEW, is_single_node: true, use_ml_runtime: true (the form Databricks' docs show)."""
    cluster = {"kind": "CLASSIC_PREVIEW", "spark_version": PLAIN, "node_type_id": "Standard_NC64as_T4_v3",
               "use_ml_runtime": True, "is_single_node": True, "num_workers": 3,
               "data_security_mode": "DATA_SECURITY_MODE_DEDICATED", "driver_node_type_id": "Standard_D8ds_v5"}
    read = request_from_cluster(cluster, ("deepspeed",), "azure")
    assert (read.num_workers, read.use_ml_runtime, read.driver_node_type_id) == (0, True, "Standard_D8ds_v5")
    assert check_cluster(read) == []
    assert "gpu-node-cpu-runtime" in rules(request_from_cluster({**cluster, "use_ml_runtime": "yes"}, ("deepspeed",)))


def test_bundle_clusters_are_checked_with_the_engine_of_their_tasks():
    cluster = {"spark_version": "13.3.x-gpu-ml-scala2.12", "node_type_id": "g5.12xlarge", "num_workers": 0}
    task = {"task_key": "t", "job_cluster_key": "gpu",
            "python_wheel_task": {"package_name": "p", "entry_point": "train", "parameters": ["--engine", "deepspeed"]}}
    tree = {"resources": {"jobs": {"train": {"job_clusters": [{"job_cluster_key": "gpu", "new_cluster": cluster}],
                                             "tasks": [task]}}}}
    [finding] = guard_findings(list(clusters_of(tree, jobs_with_tasks(tree))))
    assert finding.rule == "runtime-too-old"
    assert finding.path == "resources.jobs.train.job_clusters[0].new_cluster.spark_version"


def test_one_walk_finds_every_cluster_form_with_the_engines_that_use_it():
    """Job clusters, a task's new_cluster, the task inside a for_each_task, and all-purpose clusters named by
    existing_cluster_id: ${resources.clusters.KEY.id}."""
    wheel = lambda engine: {"package_name": "p", "entry_point": "train", "parameters": ["--engine", engine]}  # noqa
    gpu = {"spark_version": GPU_ML, "node_type_id": "g5.12xlarge", "num_workers": 0}
    tree = {"resources": {
        "jobs": {"train": {
            "job_clusters": [{"job_cluster_key": "jc", "new_cluster": gpu}],
            "tasks": [
                {"task_key": "a", "job_cluster_key": "jc", "python_wheel_task": wheel("deepspeed")},
                {"task_key": "b", "new_cluster": gpu, "python_wheel_task": wheel("ray")},
                {"task_key": "c", "for_each_task": {"inputs": "[1]", "task": {
                    "task_key": "c_inner", "new_cluster": gpu, "python_wheel_task": wheel("torch_distributor")}}},
                {"task_key": "d", "existing_cluster_id": "${resources.clusters.shared.id}",
                 "python_wheel_task": wheel("spark_ml_connect")},
            ]}},
        "clusters": {"shared": gpu, "idle": gpu}}}
    found = {path: engines for path, _, engines in clusters_of(tree, jobs_with_tasks(tree))}
    assert found == {
        ("resources", "jobs", "train", "tasks", 1, "new_cluster"): ("ray",),
        ("resources", "jobs", "train", "tasks", 2, "for_each_task", "task", "new_cluster"): ("torch_distributor",),
        ("resources", "jobs", "train", "job_clusters", 0, "new_cluster"): ("deepspeed",),
        ("resources", "clusters", "shared"): ("spark_ml_connect",),
        ("resources", "clusters", "idle"): (),
    }


CPU_ETL = {"spark_version": "15.4.x-scala2.12", "node_type_id": "m5.xlarge", "num_workers": 2}


def guard_rules(cluster, engines=()):
    return [(finding.rule, finding.severity, finding.path) for finding in guard_findings([(("c",), cluster, engines)])]


@pytest.mark.parametrize("cluster, engines, judged", [
    (CPU_ETL, (), False),  # an ordinary CPU cluster that runs no train task: not the guards' to judge
    ({**CPU_ETL, "node_type_id": "Standard_E8ds_v5"}, (), False),
    (CPU_ETL, ("spark_ml_connect",), True),  # a task runs train --engine on it
    ({**CPU_ETL, "custom_tags": {TRAINING_TAG: "true"}}, (), True),  # its user marks it
    ({**CPU_ETL, "node_type_id": "g5.12xlarge"}, (), True),  # a GPU node type of the catalog
    ({**CPU_ETL, "spark_version": GPU_ML}, (), True),  # a GPU runtime, whatever its node type
])
def test_the_guards_judge_the_clusters_that_train(cluster, engines, judged):
    assert training_cluster(cluster, engines, default_catalog()) is judged


def test_a_cluster_outside_the_catalog_that_trains_nothing_passes_and_one_that_trains_is_refused():
    assert guard_rules(CPU_ETL) == []
    [(rule, severity, path)] = guard_rules({**CPU_ETL, "custom_tags": {TRAINING_TAG: "true"}})
    assert (rule, severity, path) == ("unknown-node-type", "error", "c.node_type_id")


def test_the_fix_for_an_unknown_node_type_reads_as_a_sentence_with_or_without_a_close_match():
    [close] = check_cluster(request("Standard_NC64as_T4_v4"))
    assert close.fix.startswith("did you mean Standard_NC64as_T4_v3") and "? Otherwise add it to" in close.fix
    [far] = check_cluster(request("zz-unheard-of"))
    assert far.fix.startswith("Add it to compute/node_types.yaml, or answer allow_unknown_node_type=yes"), far.fix


@pytest.mark.parametrize("supplier, words", [
    ({"policy_id": "P1", "apply_policy_default_values": True}, "the cluster policy 'P1' supplies it"),
    ({"instance_pool_id": "pool-1"}, "the instance pool 'pool-1' supplies it"),
    ({}, "a cluster policy's defaults must supply it"),
])
def test_a_value_a_policy_or_pool_supplies_is_a_warning_not_an_error(supplier, words):
    """The node type and runtime of a cluster from a policy or a pool cannot be checked offline: a warning at each
    field, and nothing else said about it (the run's preflight checks the cluster it gets)."""
    cluster = {"num_workers": 0, "is_single_node": True, **supplier}
    findings = guard_findings([(("c",), cluster, ("torch_distributor",))])
    assert [(f.rule, f.severity, f.path) for f in findings] == [
        ("cluster-not-checked", "warning", "c.node_type_id"), ("cluster-not-checked", "warning", "c.spark_version")]
    assert all(words in finding.message for finding in findings)


def test_unresolved_references_are_left_to_the_resolver():
    assert check_cluster(request("${var.node_type}", version="${var.spark_version}")) == []


@pytest.mark.parametrize("tree", [
    {"resources": ["not", "a", "mapping"]},
    {"resources": {"jobs": {"train": {"tasks": "t", "job_clusters": [{"new_cluster": {"spark_conf": "x"}}]}}}},
    {"resources": {"jobs": {"train": {"job_clusters": [{"new_cluster": {"custom_tags": ["x"], "autoscale": 3,
                                                                        "node_type_id": "g5.xlarge"}}]}}}},
    {"resources": {"jobs": {"train": {"job_clusters": [{"job_cluster_key": ["a"], "new_cluster": {}}]}}}},
    {"resources": {"clusters": {"c": {"num_workers": True, "is_single_node": "yes", "driver_node_type_id": 3}}}},
])
def test_malformed_trees_give_findings_not_crashes(tree):
    assert all(finding.rule for finding in guard_findings(list(clusters_of(tree, jobs_with_tasks(tree)))))


# ---------------------------------------------------------------- the preflight, on the cluster itself

class _Conf:
    def __init__(self, conf):
        self.conf = conf

    def getAll(self):  # noqa: N802 - Spark's name
        return list(self.conf.items())


def _observed(monkeypatch, node_type_id, spark_version=GPU_ML, gpus=4):
    """What `preflight.observe` reads on a single-node Databricks cluster: the usage-tag confs, and torch's GPU
    count (a stand-in torch module, so the test needs no GPU and no torch import)."""
    conf = {"spark.master": "local[*, 4]", preflight.NODE_TYPE_CONF: node_type_id,
            preflight.SPARK_VERSION_CONF: spark_version, preflight.WORKERS_CONF: "0"}
    spark = types.SimpleNamespace(sparkContext=types.SimpleNamespace(getConf=lambda: _Conf(conf)))
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: gpus))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    return preflight.observe(spark)


def test_the_preflight_refuses_a_cluster_of_a_retired_node_type(monkeypatch):
    """Standard_NC24rs_v3 (NCv3 with InfiniBand) was retired on 2025-03-31 (Microsoft's NC24rs_v3 retirement notice,
    the catalog's source): the preflight names it before any training starts."""
    wanted = preflight.TrainingRequest("torch_distributor", num_nodes=1, gpus_per_node=4)
    observed = _observed(monkeypatch, "Standard_NC24rs_v3")
    assert observed.node_type_id == "Standard_NC24rs_v3"
    [finding] = preflight.check(wanted, observed)
    assert (finding.rule, finding.severity) == ("retired-node-type", "error")
    assert "Standard_NC96ads_A100_v4" in finding.fix
    assert preflight.check(wanted, _observed(monkeypatch, "Standard_NC64as_T4_v3")) == []


def flagged(node_type_id: str, **fields) -> Catalog:
    """Today's catalog with one node type's entry changed: a rule its real entries reach only at two workers or none
    (a refused family that is not Azure NC, a single-GPU size whose multi-GPU use is broken) reached at one."""
    catalog = default_catalog()
    return Catalog([replace(node, **fields) if node.id == node_type_id else node for node in catalog.node_types],
                   catalog.defaults)


GPU_TASKS = {"spark.task.resource.gpu.amount": "1"}
# (rule, its severity, the cluster beside its workers, the catalog): every rule that holds for a cluster with workers.
MULTI_NODE_RULES = [
    ("azure-nc-multi-node", "error", {"node_type_id": "Standard_NC24s_v3", "spark_conf": GPU_TASKS}, OLD_CATALOG),
    ("multi-node-refused", "error", {"node_type_id": "g5.12xlarge", "spark_conf": GPU_TASKS},
     flagged("g5.12xlarge", multi_node="refuse")),
    ("multi-node-unproven", "warning", {"node_type_id": "g5.12xlarge", "spark_conf": GPU_TASKS}, None),
    ("multi-gpu-broken", "error", {"node_type_id": "Standard_NV36ads_A10_v5", "spark_conf": GPU_TASKS},
     flagged("Standard_NV36ads_A10_v5", multi_gpu_broken=True, notes="its GPUs cannot train together")),
    ("cpu-driver-gpu-workers", "error",
     {"node_type_id": "g5.12xlarge", "spark_conf": GPU_TASKS, "driver_node_type_id": "m5d.xlarge"}, None),
    ("driver-gpu-model", "warning",
     {"node_type_id": "g5.12xlarge", "spark_conf": GPU_TASKS, "driver_node_type_id": "g4dn.xlarge"}, None),
    ("gpu-task-amount", "error", {"node_type_id": "g5.12xlarge"}, None),
]


@pytest.mark.parametrize("rule, severity, cluster, catalog", MULTI_NODE_RULES,
                         ids=[case[0] for case in MULTI_NODE_RULES])
@pytest.mark.parametrize("workers", [{"num_workers": 1}, {"autoscale": {"min_workers": 1, "max_workers": 1}}],
                         ids=["num_workers-1", "autoscale-1-1"])
def test_each_multi_node_rule_holds_from_one_worker(rule, severity, cluster, catalog, workers):
    """One worker makes a cluster of two nodes: a driver that coordinates and a worker that trains (TorchDistributor and
    DeepSpeed with localMode=False, Ray Train on the executors; compute/clusters.coordinating_driver). Every rule of a
    cluster with workers holds from the first one: a rule applied from two workers up would pass the tests that use
    0 or 2 workers alone."""
    def found(spec: dict) -> list[str]:
        request = request_from_cluster({"spark_version": GPU_ML, **cluster, **spec}, engines=("torch_distributor",))
        return rules(request, severity, catalog)

    assert rule in found(workers)
    assert rule not in found({"num_workers": 0})
