"""Where the ranks run, decided once from the cluster: a cluster with workers trains on its workers' executors, even
on one node (a num_workers=1 job beside a coordinating 1-GPU driver), a single-node cluster or a local run on the
driver; `resolve` carries it in the config and every engine launches by it. The distributors are pyspark's own, built
on a real local session (nothing runs)."""

from __future__ import annotations

import pytest

from distributed_training import config as configuration
from distributed_training.config import ConfigError
from distributed_training.engines import available, deepspeed, engine
from distributed_training.engines.ray import ray_placement
from distributed_training.launch import resolve

from support.cluster_sessions import ONE_WORKER, SINGLE_NODE, cluster_session


SHARED = "/Volumes/main/default/runs/run"  # a folder every node reads


def resolved(session, *options, engine_name="torch_distributor", output_dir=SHARED):
    argv = ["--engine", engine_name, "--table", "main.default.trips", "--output-dir", output_dir, *options]
    return resolve(configuration.from_args(argv, available()), None, session)


def test_one_worker_trains_on_its_executors_gpus():
    """The num_workers=1 job's own arguments: --num-nodes 1 and no GPUs from the driver (this machine has none)."""
    config = resolved(cluster_session(ONE_WORKER), "--num-nodes", "1")
    assert (config.on_workers, config.gpus_per_node) == (True, 4)
    assert config.placement.world_size == 4 and "on one node" in config.placement.describe()
    assert ray_placement(config, node_vcpus=48).worker_nodes == 1


def test_a_spark_connect_session_is_placed_by_the_clusters_usage_tag():
    """Databricks Connect's session has no SparkContext to observe; the cluster's Spark confs are read through it."""
    def connect_session(conf: dict[str, str]):
        session_type = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
        session = session_type()
        session.conf = cluster_session(conf).conf
        return session

    assert resolved(connect_session(ONE_WORKER)).on_workers
    assert not resolved(connect_session(SINGLE_NODE), "--gpus-per-node", "4").on_workers


def test_ranks_on_a_worker_need_an_output_folder_the_driver_shares(tmp_path):
    """The driver stages the data into the output folder and the ranks read it there: on a worker, even one, that
    folder must be one every node reads; on a single-node cluster a node-local one serves."""
    with pytest.raises(ConfigError, match=f"--output-dir {tmp_path} is not shared between nodes, but the ranks on the "
                                          "workers read the staged data from it: give a Unity Catalog volume path"):
        resolved(cluster_session(ONE_WORKER), output_dir=str(tmp_path))
    assert resolved(cluster_session(SINGLE_NODE), output_dir=str(tmp_path)).output_dir == str(tmp_path)


def test_a_single_node_cluster_and_a_local_run_train_on_the_driver(spark):
    single_node = resolved(cluster_session(SINGLE_NODE), "--gpus-per-node", "4")
    assert (single_node.on_workers, ray_placement(single_node).worker_nodes) == (False, 0)
    assert not resolved(spark).on_workers  # a real local[2] session, observed
    assert not resolved(cluster_session(ONE_WORKER), "--local").on_workers


@pytest.mark.parametrize("name", ["torch_distributor", "deepspeed"])
def test_the_distributors_run_off_the_driver_exactly_when_the_cluster_has_workers(spark, monkeypatch, name):
    """On CPU processes, so that pyspark's distributors need no GPU to be built; DeepSpeed's CPU op is not built."""
    monkeypatch.setattr(deepspeed, "build_cpu_communication_op", lambda: None)
    launcher = engine(name)
    for conf, on_driver in [(ONE_WORKER, False), (SINGLE_NODE, True)]:
        config = resolved(cluster_session(conf), "--processes", "4", engine_name=name)
        made = launcher.distributor(config, config.placement)
        assert (made.local_mode, made.num_processes) == (on_driver, 4), conf
        mode = "on the driver" if on_driver else "on the executors"
        assert mode in launcher.describe(config.placement)
