"""Preflight: the job's request against what the cluster has, each rule on both sides."""

import pytest

from distributed_training.compute.preflight import ObservedCluster, TrainingRequest, check
from distributed_training.compute.requirements import REQUIREMENTS

MULTI_NODE_CONF = {"spark.executor.resource.gpu.amount": "4", "spark.task.resource.gpu.amount": "1"}


def rules(request, observed):
    return sorted(finding.rule for finding in check(request, observed) if finding.is_error)


def cluster(master="spark://driver:7077", driver_gpus=0, workers=2, conf=MULTI_NODE_CONF, **more):
    return ObservedCluster(master=master, driver_gpus=driver_gpus, workers=workers, spark_conf=dict(conf), **more)


@pytest.mark.parametrize("request_, refused, allowed, rule", [
    (TrainingRequest("torch_distributor", 2, 4), cluster(master="local[*, 4]"), cluster(),
     "preflight-single-node-cluster"),
    (TrainingRequest("torch_distributor", 3, 4), cluster(workers=2), cluster(workers=3), "preflight-too-few-workers"),
    (TrainingRequest("torch_distributor", 1, 4), cluster(master="local[*]", driver_gpus=2),
     cluster(master="local[*]", driver_gpus=4), "preflight-gpus-missing"),
    (TrainingRequest("torch_distributor", 2, 8), cluster(), cluster(conf={**MULTI_NODE_CONF,
     "spark.executor.resource.gpu.amount": "8"}), "preflight-gpus-missing"),
    (TrainingRequest("torch_distributor", 2, 4), cluster(conf={**MULTI_NODE_CONF, "spark.task.resource.gpu.amount": "0.5"}),
     cluster(), "preflight-gpu-task-amount"),
    (TrainingRequest("ray", 2, 4), cluster(), cluster(conf={**MULTI_NODE_CONF, "spark.task.resource.gpu.amount": "0"}),
     "preflight-gpu-task-amount"),
])
def test_preflight_rule_refuses_one_and_allows_the_other(request_, refused, allowed, rule):
    assert rule in rules(request_, refused)
    assert rule not in rules(request_, allowed)


def test_cluster_settings_go_through_the_same_guards():
    on_t4 = cluster(master="local[*, 4]", driver_gpus=4, workers=0, conf={},
                    node_type_id="Standard_NC64as_T4_v3", spark_version="13.3.x-cpu-ml-scala2.12")
    assert rules(TrainingRequest("deepspeed", 1, 4), on_t4) == ["gpu-node-cpu-runtime", "runtime-too-old"]
    retired = cluster(master="local[*, 4]", driver_gpus=4, workers=0, conf={},
                      node_type_id="Standard_NC24s_v3", spark_version="17.3.x-gpu-ml-scala2.13")
    assert rules(TrainingRequest("deepspeed", 1, 4), retired) == ["retired-node-type"]


def test_a_use_ml_runtime_cluster_that_reports_its_plain_key_is_not_refused():
    """Made with `use_ml_runtime: true`, a cluster may show 17.3.x-scala2.13: the engine runs, so it is ML."""
    plain = cluster(master="local[*, 4]", driver_gpus=4, workers=0, conf={},
                    node_type_id="Standard_NC64as_T4_v3", spark_version="17.3.x-scala2.13")
    assert rules(TrainingRequest("torch_distributor", 1, 4), plain) == []


def test_a_real_local_spark_session_is_observed_and_refused_for_what_it_lacks(spark):
    from distributed_training.compute.preflight import observe

    observed = observe(spark)
    assert observed.single_node and observed.master.startswith("local") and observed.driver_gpus == 0
    assert rules(TrainingRequest("torch_distributor", 2, 0), observed) == ["preflight-single-node-cluster"]
    assert rules(TrainingRequest("torch_distributor", 1, 4), observed) == ["preflight-gpus-missing"]
    assert rules(TrainingRequest("torch_distributor", 1, 0), observed) == []


GPU_RUNTIME = "17.3.x-gpu-ml-scala2.13"


def driver_rules(driver_node_type_id):
    """The findings about a 2-worker g5.12xlarge cluster's driver (the guards', which the preflight applies)."""
    observed = cluster(driver_gpus=1, node_type_id="g5.12xlarge", spark_version=GPU_RUNTIME,
                       driver_node_type_id=driver_node_type_id)
    return [(finding.rule, finding.severity) for finding in check(TrainingRequest("torch_distributor", 2, 4), observed)
            if "driver" in finding.rule]


def test_the_driver_is_checked_against_the_workers_it_coordinates():
    """The template's multi-node driver is the smallest GPU size of the workers' family. Precision is chosen from the
    driver's GPU (launch.py), so a driver of another GPU model is a warning; a CPU driver beside GPU workers is the
    guards' error on AWS (Databricks docs "GPU-enabled compute": GPU driver and worker types)."""
    assert driver_rules("g5.xlarge") == []
    assert driver_rules(None) == []  # the default: a driver of the workers' type
    assert driver_rules("g4dn.xlarge") == [("driver-gpu-model", "warning")]
    assert driver_rules("m5d.xlarge") == [("cpu-driver-gpu-workers", "error")]
    [warning] = [finding for finding in check(TrainingRequest("torch_distributor", 2, 4), cluster(
        driver_gpus=1, node_type_id="g5.12xlarge", spark_version=GPU_RUNTIME, driver_node_type_id="g4dn.xlarge"))
        if finding.rule == "driver-gpu-model"]
    assert warning.message == ("driver g4dn.xlarge has T4 GPUs, the workers g5.12xlarge A10G: the precision follows "
                               "the driver's")


def test_the_driver_and_worker_types_are_read_from_the_clusters_usage_tags():
    """Databricks sets clusterNodeType (the workers') and driverNodeType among a cluster's Spark confs."""
    from types import SimpleNamespace

    from distributed_training.compute.preflight import DRIVER_NODE_TYPE_CONF, NODE_TYPE_CONF, WORKERS_CONF, observe

    conf = {"spark.master": "spark://10.0.0.1:7077", WORKERS_CONF: "2", NODE_TYPE_CONF: "g5.12xlarge",
            DRIVER_NODE_TYPE_CONF: "g5.xlarge"}
    session = SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: SimpleNamespace(
        getAll=lambda: list(conf.items()))))
    observed = observe(session)
    assert (observed.node_type_id, observed.driver_node_type_id, observed.workers) == ("g5.12xlarge", "g5.xlarge", 2)


def one_worker(engine: str):
    """A num_workers=1 job cluster: a coordinating g5.xlarge driver (1 GPU) beside one 4-GPU g5.12xlarge worker."""
    conf = {"spark.executor.resource.gpu.amount": "4",
            "spark.task.resource.gpu.amount": REQUIREMENTS[engine].task_gpu_amount}
    return cluster(driver_gpus=1, workers=1, conf=conf, node_type_id="g5.12xlarge", spark_version=GPU_RUNTIME,
                   driver_node_type_id="g5.xlarge")


@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed", "ray"])
def test_one_worker_trains_on_its_executors_gpus_not_the_coordinating_drivers(engine):
    """One node on a cluster with a worker: the ranks run on the worker, so its executor's GPUs are what counts."""
    assert rules(TrainingRequest(engine, 1, 4), one_worker(engine)) == []
    assert one_worker(engine).trains_on_workers and one_worker(engine).driver_gpus == 1
    [refusal] = [finding for finding in check(TrainingRequest(engine, 1, 8), one_worker(engine)) if finding.is_error]
    assert refusal.rule == "preflight-gpus-missing"
    assert refusal.message == ("the job asks for 1 node(s) x 8 GPU(s), but each executor "
                               "(spark.executor.resource.gpu.amount) has 4 GPU(s)")
    assert "preflight-gpu-task-amount" in rules(TrainingRequest(engine, 1, 4), cluster(
        driver_gpus=4, workers=1, conf={**MULTI_NODE_CONF, "spark.task.resource.gpu.amount": "0.5"}))


def test_only_a_cluster_with_workers_trains_off_the_driver():
    """Spark's own test for a local master (Utils.isLocalMaster): local-cluster[...] has executors of its own."""
    assert not cluster(master="local[*, 4]", workers=0).trains_on_workers
    assert not cluster(master="local", workers=0).trains_on_workers
    assert not cluster(workers=0).trains_on_workers  # a standalone master whose workers are not up
    assert cluster(master="local-cluster[1,2,1024]", workers=1).trains_on_workers
    assert cluster(workers=1).trains_on_workers
