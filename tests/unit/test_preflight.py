"""Preflight: the job's request against what the cluster has, each rule on both sides."""

import pytest

from distributed_training.compute.preflight import ObservedCluster, TrainingRequest, check

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
