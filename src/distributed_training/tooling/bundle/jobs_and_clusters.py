"""Every classic cluster a bundle can define, found by one walk, and the guards over the clusters that train.

Job clusters (with the engines of the tasks that use them), a task's own `new_cluster`, the task inside a
`for_each_task`, and all-purpose clusters under `resources.clusters` (with the engines of the tasks that name them
by `existing_cluster_id: ${resources.clusters.KEY.id}`). The walk runs on each target's merged tree.

The guards judge a cluster that trains (`training_cluster`): one a task runs the project's `train --engine E` on, one
with GPUs (a GPU node type of the catalog, or a GPU runtime), or one its user marks with the custom tag
`training: "true"`. Any other cluster (an ETL job's, a dashboard's warehouse-side work) is not theirs to judge: the
Databricks CLI accepts any node type, and so does `validate`. A value a cluster policy or an instance pool supplies
(no `node_type_id`, no `spark_version` in the bundle) cannot be checked offline: a warning, and the run's preflight
checks what the cluster really got.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

from ...compute.catalog import Catalog, default_catalog
from ...compute.guards import OVERRIDE_TAG, ClusterRequest, check_cluster
from ...compute.runtime import parse_runtime
from ...findings import Finding
from .paths import Path, format_path

CLUSTER_REFERENCE = re.compile(r"^\$\{resources\.clusters\.([^.}]+)\.id\}$")
# Custom tag a user sets to "true" to have the guards judge a cluster that runs no `train` task and has no GPU.
TRAINING_TAG = "training"
# What may supply a field a cluster leaves out, and the fields the guards read that it may supply, with the rule
# that would otherwise judge each.
SUPPLIERS = (("policy_id", "cluster policy"), ("instance_pool_id", "instance pool"))
SUPPLIED_FIELDS = {"node_type_id": "unknown-node-type", "spark_version": "unknown-spark-version"}


def as_mapping(value: Any) -> Mapping:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def jobs_of(tree: Mapping) -> Iterator[tuple[str, Mapping]]:
    for key, job in as_mapping(as_mapping(tree.get("resources")).get("jobs")).items():
        if isinstance(job, dict):
            yield str(key), job


def tasks_of(job: Mapping, job_path: Path) -> Iterator[tuple[Path, Mapping]]:
    """Every task of a job with its path, including the task inside a for_each_task."""
    for index, task in enumerate(as_list(job.get("tasks"))):
        if not isinstance(task, dict):
            continue
        path = (*job_path, "tasks", index)
        yield path, task
        inner = as_mapping(task.get("for_each_task")).get("task")
        if isinstance(inner, dict):
            yield (*path, "for_each_task", "task"), inner


# (job key, job, its tasks with their paths: `tasks_of`) for every job of a tree: `jobs_with_tasks`.
Jobs = list[tuple[str, Mapping, list[tuple[Path, Mapping]]]]


def jobs_with_tasks(tree: Mapping) -> Jobs:
    """Every job of a tree with its tasks: one walk, which the checks of a target share (their `jobs`)."""
    return [(key, job, list(tasks_of(job, ("resources", "jobs", key)))) for key, job in jobs_of(tree)]


def task_engine(task: Mapping) -> str | None:
    """The `--engine` a task's `train` wheel task is given, if any."""
    return task_option(task, "--engine")


def task_clusters(tree: Mapping, jobs: Jobs) -> Iterator[tuple[Path, Mapping, Path, Mapping]]:
    """(task path, task, cluster path, cluster spec) for every task that runs on a classic cluster the bundle
    defines: its own `new_cluster`, a job cluster by `job_cluster_key`, or an all-purpose cluster named by
    `existing_cluster_id: ${resources.clusters.KEY.id}`."""
    all_purpose = as_mapping(as_mapping(tree.get("resources")).get("clusters"))
    for job_key, job, tasks in jobs:
        job_path = ("resources", "jobs", job_key)
        job_clusters: dict[str, tuple[int, Mapping]] = {}
        for index, job_cluster in enumerate(as_list(job.get("job_clusters"))):
            if (isinstance(job_cluster, dict) and isinstance(job_cluster.get("new_cluster"), dict)
                    and isinstance(job_cluster.get("job_cluster_key"), str)):
                job_clusters.setdefault(job_cluster["job_cluster_key"], (index, job_cluster["new_cluster"]))
        for task_path, task in tasks:
            if isinstance(task.get("new_cluster"), dict):
                yield task_path, task, (*task_path, "new_cluster"), task["new_cluster"]
            key = task.get("job_cluster_key")
            if isinstance(key, str) and key in job_clusters:
                index, cluster = job_clusters[key]
                yield task_path, task, (*job_path, "job_clusters", index, "new_cluster"), cluster
            named = CLUSTER_REFERENCE.match(str(task.get("existing_cluster_id", "")))
            if named and isinstance(all_purpose.get(named.group(1)), dict):
                yield task_path, task, ("resources", "clusters", named.group(1)), all_purpose[named.group(1)]


def clusters_of(tree: Mapping, jobs: Jobs) -> Iterator[tuple[Path, Mapping, tuple[str, ...]]]:
    """(path, cluster spec, engines trained on it) for every classic cluster of a merged tree."""
    engines: dict[Path, list[str]] = {}
    for _, task, cluster_path, _ in task_clusters(tree, jobs):
        engine = task_engine(task)
        if engine:
            engines.setdefault(cluster_path, []).append(engine)

    def used_by(path: Path) -> tuple[str, ...]:
        return tuple(dict.fromkeys(engines.get(path, ())))

    for _, _, tasks in jobs:
        for task_path, task in tasks:
            if isinstance(task.get("new_cluster"), dict):
                yield (*task_path, "new_cluster"), task["new_cluster"], used_by((*task_path, "new_cluster"))
    for job_key, job, _ in jobs:
        for index, job_cluster in enumerate(as_list(job.get("job_clusters"))):
            if isinstance(job_cluster, dict) and isinstance(job_cluster.get("new_cluster"), dict):
                path = ("resources", "jobs", job_key, "job_clusters", index, "new_cluster")
                yield path, job_cluster["new_cluster"], used_by(path)
    for key, cluster in as_mapping(as_mapping(tree.get("resources")).get("clusters")).items():
        if isinstance(cluster, dict):
            path = ("resources", "clusters", str(key))
            yield path, cluster, used_by(path)


def task_option(task: Mapping, flag: str) -> str | None:
    """The value a task's wheel task passes for `flag` (`--engine`, `--num-nodes`), if any."""
    parameters = as_list(as_mapping(task.get("python_wheel_task")).get("parameters"))
    for name, value in zip(parameters, parameters[1:]):
        if name == flag:
            return str(value)
    return None


def request_from_cluster(cluster: Mapping, engines: tuple[str, ...] = (), cloud: str | None = None) -> ClusterRequest:
    """A cluster spec (as in a bundle) read into a request. Unresolved `${...}` values stay as text; malformed parts
    (the schema's findings) are read as absent."""
    num_workers = cluster.get("num_workers", 0)
    autoscale = as_mapping(cluster.get("autoscale"))
    if "max_workers" in autoscale:
        num_workers = autoscale["max_workers"]
    if cluster.get("is_single_node") is True:
        num_workers = 0
    return ClusterRequest(
        node_type_id=str(cluster.get("node_type_id", "")),
        num_workers=num_workers if isinstance(num_workers, int) and not isinstance(num_workers, bool) else 0,
        spark_version=str(cluster.get("spark_version", "")),
        engines=engines,
        cloud=cloud,
        data_security_mode=cluster.get("data_security_mode"),
        runtime_engine=cluster.get("runtime_engine"),
        spark_conf={str(key): str(value) for key, value in as_mapping(cluster.get("spark_conf")).items()},
        allow_unknown_node_type=str(as_mapping(cluster.get("custom_tags")).get(OVERRIDE_TAG, "")).lower() == "true",
        use_ml_runtime=cluster.get("use_ml_runtime") is True,
        driver_node_type_id=cluster.get("driver_node_type_id") if isinstance(cluster.get("driver_node_type_id"),
                                                                              str) else None,
    )


def guard_findings(clusters: list[tuple[Path, Mapping, tuple[str, ...]]], catalog: Catalog | None = None
                   ) -> list[Finding]:
    """The guards on every cluster of a merged tree that trains (one target: its `clusters_of`), with `path` set
    inside it; a field the bundle leaves to a policy or a pool is a warning in place of the guard's verdict on it."""
    catalog = catalog or default_catalog()
    findings: list[Finding] = []
    for path, cluster, engines in clusters:
        if not training_cluster(cluster, engines, catalog):
            continue
        where = format_path(path)
        unset = [field for field in SUPPLIED_FIELDS if cluster.get(field) in (None, "")]
        findings += [_not_checked(cluster, field, f"{where}.{field}") for field in unset]
        left_to_supplier = {(SUPPLIED_FIELDS[field], f"{where}.{field}") for field in unset}
        findings += [finding for finding in check_cluster(request_from_cluster(cluster, engines), where, catalog)
                     if (finding.rule, finding.path) not in left_to_supplier]
    return findings


def training_cluster(cluster: Mapping, engines: tuple[str, ...], catalog: Catalog) -> bool:
    """Whether the guards judge `cluster`: it runs `train` (`engines`), has GPUs, or carries the training tag."""
    if engines or str(as_mapping(cluster.get("custom_tags")).get(TRAINING_TAG, "")).lower() == "true":
        return True
    node = catalog.find(str(cluster.get("node_type_id", "")))
    runtime = parse_runtime(str(cluster.get("spark_version", "")))
    return (node is not None and node.has_gpu) or (runtime is not None and runtime.gpu)


def _not_checked(cluster: Mapping, field: str, where: str) -> Finding:
    supplied = [f"the {name} {cluster[key]!r}" for key, name in SUPPLIERS if cluster.get(key)]
    source = f"{' or '.join(supplied)} supplies it" if supplied else "a cluster policy's defaults must supply it"
    return Finding("cluster-not-checked", f"the cluster sets no {field} ({source}): the guards cannot check it "
                   "offline", f"set {field} in the bundle to have it checked now; else the run's preflight checks "
                   "the cluster it gets", path=where, severity="warning")
