"""Rules the JSON schema cannot express: cross-references inside a job, single-node cluster forms, serverless GPU
tasks, targets.

Each check takes a tree and returns findings whose `path` is set; the caller names the file.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..compute import serverless
from ..compute.guards import task_engine
from ..findings import Finding
from .paths import Path, format_path

SINGLE_NODE_PROFILE = ("spark.databricks.cluster.profile", "singleNode")
SINGLE_NODE_TAG = ("ResourceClass", "SingleNode")
CLASSIC_SINGLE_NODE = ('num_workers: 0, spark_conf: {spark.databricks.cluster.profile: singleNode, '
                       'spark.master: "local[*, 4]"}, custom_tags: {ResourceClass: SingleNode}')
NEW_SINGLE_NODE = "kind: CLASSIC_PREVIEW, is_single_node: true (and use_ml_runtime: true on an ML runtime)"


def _mapping(value: Any) -> Mapping:
    return value if isinstance(value, dict) else {}


def resource_shape_findings(tree: Mapping) -> list[Finding]:
    """`resources` must map resource types to mappings of resource keys to resource mappings. The schema says so
    too, but it is optional: without it a list here would otherwise pass unnoticed."""
    resources = tree.get("resources")
    if resources is None:
        return []
    if not _mapping_or_reference(resources):
        return [_not_a_mapping(("resources",), "of resource types (jobs, pipelines, ...)")]
    findings = []
    for resource_type, of_type in _mapping(resources).items():
        if not _mapping_or_reference(of_type):
            findings.append(_not_a_mapping(("resources", resource_type), "of resource keys to resources"))
        findings += [_not_a_mapping(("resources", resource_type, key), "of the resource's fields")
                     for key, resource in _mapping(of_type).items() if not _mapping_or_reference(resource)]
    return findings


def _mapping_or_reference(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, str) and value.startswith("${"))


def _not_a_mapping(path: Path, of_what: str) -> Finding:
    return Finding("not-a-mapping", f"{format_path(path)} must be a mapping {of_what}",
                   f"write {format_path(path)} as a mapping {of_what}", path=format_path(path))


def jobs_of(tree: Mapping) -> Iterator[tuple[str, Mapping]]:
    for key, job in _mapping(_mapping(tree.get("resources")).get("jobs")).items():
        if isinstance(job, dict):
            yield str(key), job


def tasks_of(job: Mapping, job_path: Path) -> Iterator[tuple[Path, Mapping]]:
    """Every task of a job with its path, including the task inside a for_each_task."""
    tasks = job.get("tasks")
    for index, task in enumerate(tasks if isinstance(tasks, list) else []):
        if not isinstance(task, dict):
            continue
        path = (*job_path, "tasks", index)
        yield path, task
        inner = _mapping(task.get("for_each_task")).get("task")
        if isinstance(inner, dict):
            yield (*path, "for_each_task", "task"), inner


def job_cluster_key_findings(tree: Mapping) -> list[Finding]:
    findings = []
    for job_key, job in jobs_of(tree):
        job_path = ("resources", "jobs", job_key)
        clusters = job.get("job_clusters") if isinstance(job.get("job_clusters"), list) else []
        defined = [cluster.get("job_cluster_key") for cluster in clusters if isinstance(cluster, dict)]
        for task_path, task in tasks_of(job, job_path):
            key = task.get("job_cluster_key")
            if isinstance(key, str) and "${" not in key and key not in defined:
                known = ", ".join(map(str, defined)) or "none"
                findings.append(Finding(
                    "dangling-job-cluster-key",
                    f"task {task.get('task_key')!r} uses job cluster {key!r}, which job {job_key!r} does not define "
                    f"(its job_clusters: {known})",
                    f"add a job_clusters entry with job_cluster_key: {key}, or use one of: {known}",
                    path=format_path((*task_path, "job_cluster_key"))))
    return findings


def _clusters(tree: Mapping) -> Iterator[tuple[Path, Mapping]]:
    """Every classic cluster spec of a tree: job clusters, task clusters, all-purpose clusters."""
    for job_key, job in jobs_of(tree):
        job_path = ("resources", "jobs", job_key)
        job_clusters = job.get("job_clusters")
        for index, job_cluster in enumerate(job_clusters if isinstance(job_clusters, list) else []):
            if isinstance(job_cluster, dict) and isinstance(job_cluster.get("new_cluster"), dict):
                yield (*job_path, "job_clusters", index, "new_cluster"), job_cluster["new_cluster"]
        for task_path, task in tasks_of(job, job_path):
            if isinstance(task.get("new_cluster"), dict):
                yield (*task_path, "new_cluster"), task["new_cluster"]
    for key, cluster in _mapping(_mapping(tree.get("resources")).get("clusters")).items():
        if isinstance(cluster, dict):
            yield ("resources", "clusters", str(key)), cluster


def single_node_findings(tree: Mapping) -> list[Finding]:
    findings = []
    for path, cluster in _clusters(tree):
        findings += _single_node_cluster(cluster, path)
    return findings


def _single_node_cluster(cluster: Mapping, path: Path) -> list[Finding]:
    spark_conf = _mapping(cluster.get("spark_conf"))
    custom_tags = _mapping(cluster.get("custom_tags"))
    classic_parts = {
        "spark_conf.spark.databricks.cluster.profile: singleNode":
            spark_conf.get(SINGLE_NODE_PROFILE[0]) == SINGLE_NODE_PROFILE[1],
        'spark_conf.spark.master: "local[*, 4]"': str(spark_conf.get("spark.master", "")).startswith("local["),
        "custom_tags.ResourceClass: SingleNode": custom_tags.get(SINGLE_NODE_TAG[0]) == SINGLE_NODE_TAG[1],
    }
    new_form = cluster.get("kind") == "CLASSIC_PREVIEW" and cluster.get("is_single_node") is True
    if cluster.get("is_single_node") is True and any(classic_parts.values()):
        present = ", ".join(part for part, there in classic_parts.items() if there)
        return [Finding("single-node-mixed-forms",
                        f"the cluster sets is_single_node: true and also the classic single-node settings ({present})",
                        f"keep one form: either {NEW_SINGLE_NODE}, or {CLASSIC_SINGLE_NODE}; the API refuses both",
                        path=format_path(path))]
    num_workers = cluster.get("num_workers")
    if num_workers != 0 or "policy_id" in cluster or new_form or all(classic_parts.values()):
        return []  # a cluster policy may supply the single-node settings itself
    missing = [part for part, there in classic_parts.items() if not there]
    return [Finding("single-node-incomplete",
                    f"num_workers is 0 but the cluster is not set up as single node (missing: {', '.join(missing)}): "
                    "Spark would wait for workers that never come",
                    f"use the classic form, {CLASSIC_SINGLE_NODE}, or the new one, {NEW_SINGLE_NODE}",
                    path=format_path((*path, "num_workers")))]


CLASSIC_TASK_COMPUTE = ("job_cluster_key", "new_cluster", "existing_cluster_id", "libraries")
NOT_WORKSPACE_PATHS = ("/Volumes/", "/dbfs/", "dbfs:", "s3:", "abfss:", "gs:")


def serverless_gpu_findings(tree: Mapping) -> list[Finding]:
    """Every `ai_runtime_task`: no classic cluster beside it, one deployment (the preview's limit), accelerators the
    platform offers, and an engine whose loop runs under torchrun (the `--engine` of the job's wheel tasks)."""
    findings = []
    for job_key, job in jobs_of(tree):
        job_path = ("resources", "jobs", job_key)
        tasks = list(tasks_of(job, job_path))
        gpu_tasks = [(path, task) for path, task in tasks if isinstance(task.get("ai_runtime_task"), dict)]
        for task_path, task in gpu_tasks:
            findings += _serverless_gpu_task(task_path, task)
        if gpu_tasks:
            for task_path, task in tasks:
                engine = task_engine(task)
                if engine is not None:
                    findings += serverless.check_engine(engine, format_path(
                        (*task_path, "python_wheel_task", "parameters")))
    return findings


def _serverless_gpu_task(task_path: Path, task: Mapping) -> list[Finding]:
    findings = [Finding("mixed-compute", f"task {task.get('task_key')!r} runs on serverless GPU compute "
                        f"(ai_runtime_task) but also sets {name}, which belongs to classic clusters",
                        f"drop {name}: the task's size is its accelerator_type and accelerator_count, and its "
                        "packages are its environment's dependencies", path=format_path((*task_path, name)))
                for name in CLASSIC_TASK_COMPUTE if name in task]
    deployments_path = (*task_path, "ai_runtime_task", "deployments")
    deployments = task["ai_runtime_task"].get("deployments")
    if isinstance(deployments, list) and len(deployments) != 1:
        findings.append(Finding("serverless-gpu-deployments",
                                f"ai_runtime_task has {len(deployments)} deployments; the preview runs exactly one",
                                "give one deployment: every node runs its command", path=format_path(deployments_path)))
    for index, deployment in enumerate(deployments if isinstance(deployments, list) else []):
        findings += _command_path(_mapping(deployment).get("command_path"), (*deployments_path, index, "command_path"))
        compute = _mapping(_mapping(deployment).get("compute"))
        if compute:
            prefix = format_path((*deployments_path, index, "compute")) + "."
            findings += serverless.check_accelerators(compute.get("accelerator_type"),
                                                      compute.get("accelerator_count"), prefix)
    return findings


def _command_path(command_path, path: Path) -> list[Finding]:
    """The platform documents command_path as a workspace file; a volume or DBFS path is not one."""
    if not isinstance(command_path, str) or not command_path.startswith(NOT_WORKSPACE_PATHS):
        return []
    return [Finding("serverless-gpu-command-path",
                    f"command_path {command_path} is not a workspace path, and the platform runs the script at a "
                    "workspace path on each node",
                    "write the script to a workspace file, e.g. ${workspace.root_path}/torchrun/command.sh (`train "
                    "--handoff-to-torchrun --command-path` writes it there), and name that path",
                    path=format_path(path), severity="warning")]


def production_root_path_findings(root_tree: Mapping) -> list[Finding]:
    """A `mode: production` target must set `workspace.root_path` itself (not inherit a shared one)."""
    findings = []
    for name, target in _mapping(root_tree.get("targets")).items():
        target = _mapping(target)
        if target.get("mode") == "production" and not _mapping(target.get("workspace")).get("root_path"):
            findings.append(Finding(
                "production-without-root-path",
                f"target {name!r} is in production mode but does not set its own workspace.root_path, so its "
                "deployment would land in a folder tied to whoever deploys it",
                f"set targets.{name}.workspace.root_path, e.g. /Workspace/Shared/.bundle/${{bundle.name}}/"
                "${bundle.target} (or a service principal's home)",
                path=format_path(("targets", str(name)))))
    return findings


def default_target_findings(root_tree: Mapping) -> list[Finding]:
    defaults = [str(name) for name, target in _mapping(root_tree.get("targets")).items()
                if _mapping(target).get("default") is True]
    if len(defaults) < 2:
        return []
    return [Finding("several-default-targets", f"targets {', '.join(defaults)} are all marked default: true",
                    "mark one target (usually dev) as default: true", path=format_path(("targets", name, "default")))
            for name in defaults[1:]]
