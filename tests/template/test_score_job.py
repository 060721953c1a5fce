"""The score job's cluster schedules a GPU to each Spark task where it has several GPU nodes: every Python worker
that scores loads the model, onto the GPU of its task (Databricks docs, "GPU scheduling":
`spark.task.resource.gpu.amount` on multi-node clusters). A Ray job's cluster keeps GPUs away from Spark's tasks
(`spark.task.resource.gpu.amount` 0, for Ray's own workers), so scoring on it would put a model per worker on GPUs
of their choosing; the score job has its own settings. One node runs Spark in local mode, with no GPU scheduling:
there `score` bounds the models a GPU itself (tests/unit/test_scoring_rows.py)."""

from __future__ import annotations

import pytest
import yaml


def clusters(project, job_file: str) -> dict:
    [job] = yaml.safe_load((project / "resources" / job_file).read_text())["resources"]["jobs"].values()
    return {cluster["job_cluster_key"]: cluster["new_cluster"] for cluster in job["job_clusters"]}


@pytest.mark.parametrize("engine", ["ray", "torch_distributor", "deepspeed"])
def test_on_several_gpu_nodes_each_scoring_task_gets_a_gpu_of_its_own(rendered, engine):
    project = rendered(engine=engine, cloud="aws", node_type_id="g5.12xlarge", num_workers="2")
    training = clusters(project, f"train_{engine}.job.yml")["training"]
    scoring = clusters(project, "score.job.yml")["scoring"]
    assert training["spark_conf"]["spark.task.resource.gpu.amount"] == ("0" if engine == "ray" else "1")
    assert scoring["spark_conf"] == {"spark.task.resource.gpu.amount": "1"}
    assert {**scoring, "spark_conf": None} == {**training, "spark_conf": None}  # otherwise the same cluster


def test_on_one_node_the_score_cluster_is_the_training_cluster(rendered):
    project = rendered()
    scoring = clusters(project, "score.job.yml")["scoring"]
    assert scoring == clusters(project, "train_torch_distributor.job.yml")["training"]
    assert scoring["is_single_node"] is True and "spark_conf" not in scoring
