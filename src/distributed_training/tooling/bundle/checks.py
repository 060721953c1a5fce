"""Rules the JSON schema cannot express: cross-references inside a job, single-node cluster forms, targets.

Each check takes a tree and returns findings whose `path` is set; the caller names the file.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...findings import Finding
from .jobs_and_clusters import Jobs, as_mapping, task_clusters, task_option
from .paths import Path, format_path
from .sourced_trees import file_at

SINGLE_NODE_PROFILE = ("spark.databricks.cluster.profile", "singleNode")
SINGLE_NODE_TAG = ("ResourceClass", "SingleNode")
CLASSIC_SINGLE_NODE = ('num_workers: 0, spark_conf: {spark.databricks.cluster.profile: singleNode, '
                       'spark.master: "local[*, 4]"}, custom_tags: {ResourceClass: SingleNode}')
NEW_SINGLE_NODE = "kind: CLASSIC_PREVIEW, is_single_node: true (and use_ml_runtime: true on an ML runtime)"



def resource_shape_findings(tree: Mapping) -> list[Finding]:
    """`resources` maps resource types to mappings of resource keys to resource mappings. A resource left empty
    (`my_job:` with nothing after it) is an error, as for the CLI ("job my_job is not defined",
    bundle/config/validate/all_resources_have_values.go); any other value that is not a mapping is a warning: the CLI's
    loader drops it with one (libs/dyn/convert/normalize.go). The schema says so too, but it is optional."""
    resources = tree.get("resources")
    if resources is None:
        return []
    if not _mapping_or_reference(resources):
        return [_not_a_mapping(("resources",), "of resource types (jobs, pipelines, ...)")]
    findings = []
    for resource_type, of_type in as_mapping(resources).items():
        if of_type is not None and not _mapping_or_reference(of_type):
            findings.append(_not_a_mapping(("resources", resource_type), "of resource keys to resources"))
        for key, resource in as_mapping(of_type).items():
            if resource is None:
                singular = str(resource_type).removesuffix("s")
                findings.append(Finding("resource-not-defined", f"{singular} {key} is not defined: it has no fields "
                                        "(the CLI stops here)", f"give resources.{resource_type}.{key} its fields, or "
                                        "remove the key", path=format_path(("resources", resource_type, key))))
            elif not _mapping_or_reference(resource):
                findings.append(_not_a_mapping(("resources", resource_type, key), "of the resource's fields"))
    return findings


def _mapping_or_reference(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, str) and value.startswith("${"))


def _not_a_mapping(path: Path, of_what: str) -> Finding:
    return Finding("not-a-mapping", f"{format_path(path)} must be a mapping {of_what}: the CLI drops it with a warning",
                   f"write {format_path(path)} as a mapping {of_what}", path=format_path(path), severity="warning")


def job_cluster_key_findings(jobs: Jobs) -> list[Finding]:
    findings = []
    for job_key, job, tasks in jobs:
        clusters = job.get("job_clusters") if isinstance(job.get("job_clusters"), list) else []
        defined = [cluster.get("job_cluster_key") for cluster in clusters if isinstance(cluster, dict)]
        for task_path, task in tasks:
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


def single_node_findings(clusters: list[tuple[Path, Mapping, tuple[str, ...]]]) -> list[Finding]:
    """Single-node settings against the worker count, for every cluster of a target (its `clusters_of`)."""
    findings = []
    for path, cluster, _ in clusters:
        findings += _single_node_cluster(cluster, path)
    return findings


def _classic_single_node_parts(cluster: Mapping) -> dict[str, bool]:
    spark_conf = as_mapping(cluster.get("spark_conf"))
    custom_tags = as_mapping(cluster.get("custom_tags"))
    return {
        "spark_conf.spark.databricks.cluster.profile: singleNode":
            spark_conf.get(SINGLE_NODE_PROFILE[0]) == SINGLE_NODE_PROFILE[1],
        'spark_conf.spark.master: "local[*, 4]"': str(spark_conf.get("spark.master", "")).startswith("local"),
        "custom_tags.ResourceClass: SingleNode": custom_tags.get(SINGLE_NODE_TAG[0]) == SINGLE_NODE_TAG[1],
    }


def _workers(cluster: Mapping) -> int | None:
    """The worker nodes a cluster asks for beyond its driver (autoscale: its maximum); None when not a number."""
    value = as_mapping(cluster.get("autoscale")).get("max_workers", cluster.get("num_workers", 0))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _single_node_cluster(cluster: Mapping, path: Path) -> list[Finding]:
    classic_parts = _classic_single_node_parts(cluster)
    workers = _workers(cluster)
    if workers:
        single = [part for part, there in classic_parts.items() if there]
        single += ["is_single_node: true"] if cluster.get("is_single_node") is True else []
        if single:
            field = "autoscale.max_workers" if "autoscale" in cluster else "num_workers"
            return [Finding(
                "single-node-settings-on-multi-node",
                f"{field} is {workers} but the cluster keeps the single-node settings ({', '.join(single)}): "
                "Databricks starts it as one node (Spark master local), so the workers would idle",
                f"for {workers} worker nodes remove {', '.join(single)} and pass --num-nodes {workers} to train; "
                f"for one node set num_workers: 0 and keep them", path=format_path((*path, *field.split("."))))]
    if cluster.get("is_single_node") is True and any(classic_parts.values()):
        present = ", ".join(part for part, there in classic_parts.items() if there)
        return [Finding("single-node-mixed-forms",
                        f"the cluster sets is_single_node: true and also the classic single-node settings ({present})",
                        f"keep one form: either {NEW_SINGLE_NODE}, or {CLASSIC_SINGLE_NODE}; the API refuses both",
                        path=format_path(path))]
    num_workers = cluster.get("num_workers")
    if num_workers != 0 or "policy_id" in cluster or cluster.get("is_single_node") is True \
            or all(classic_parts.values()):
        return []  # a cluster policy may supply the single-node settings itself
    missing = [part for part, there in classic_parts.items() if not there]
    return [Finding("single-node-incomplete",
                    f"num_workers is 0 but the cluster is not set up as single node (missing: {', '.join(missing)}): "
                    "Spark would wait for workers that never come (the CLI warns: bundle/config/validate/"
                    "single_node_cluster.go)", f"use the classic form, {CLASSIC_SINGLE_NODE}, or the new one, "
                    f"{NEW_SINGLE_NODE}", path=format_path((*path, "num_workers")), severity="warning")]


def num_nodes_findings(tree: Mapping, jobs: Jobs) -> list[Finding]:
    """`train --num-nodes N` against the cluster its task runs on: more nodes than the cluster has fails the
    run's preflight (compute/preflight.py). Fewer is allowed, as the preflight allows it (the driver alone, say)."""
    findings = []
    for task_path, task, _, cluster in task_clusters(tree, jobs):
        asked = task_option(task, "--num-nodes")
        if asked is None or not asked.isascii() or not asked.isdigit():
            continue  # absent, or filled in at run time ({{job.parameters...}}, ${var...})
        nodes, workers = int(asked), _workers(cluster)
        if workers is None:
            continue
        single_node = workers == 0 or cluster.get("is_single_node") is True
        where = format_path((*task_path, "python_wheel_task", "parameters"))
        task_name = repr(task.get("task_key"))
        if single_node and nodes > 1:
            findings.append(Finding(
                "num-nodes-mismatch", f"task {task_name} passes --num-nodes {nodes} but its cluster is single node: "
                "the run's preflight refuses it", f"pass --num-nodes 1, or give the cluster num_workers: {nodes} "
                "(without the single-node settings)", path=where))
        elif not single_node and nodes > workers:
            findings.append(Finding(
                "num-nodes-mismatch", f"task {task_name} passes --num-nodes {nodes} but its cluster has {workers} "
                "worker(s): the run's preflight refuses it", f"pass --num-nodes {workers}, or raise num_workers "
                f"to {nodes}", path=where))
    return findings


def bundle_name_findings(tree: Mapping) -> list[Finding]:
    """`bundle.name` is required: the CLI names the deployment folder after it and stops without one
    (bundle/config/mutator/default_workspace_root.go: "bundle name not defined"; the schema's config.Bundle
    requires it too)."""
    name = as_mapping(tree.get("bundle")).get("name")
    if isinstance(name, (int, float)) or (isinstance(name, str) and name):  # a number is read as its text
        return []
    what = "is empty" if isinstance(name, str) else "is missing" if name is None else f"is {name!r}, not a name"
    return [Finding("bundle-name-missing", f"bundle.name {what}: the CLI stops (\"unable to define default "
                    "workspace root: bundle name not defined\")", "set bundle: {name: <your_project>} in "
                    "databricks.yml", path="bundle.name")]


def production_root_path_findings(root_tree: Mapping, target: str, tree: Mapping) -> list[Finding]:
    """A `mode: production` target should set `workspace.root_path` itself (not inherit a shared one). The CLI refuses
    it when a user deploys it, and only recommends it when a service principal deploys or run_as is set for every job
    (bundle/config/mutator/resourcemutator/validate_target_mode.go, validateProductionMode): who deploys cannot be
    known offline, and production is commonly deployed by a principal from CI, so it is a warning here."""
    section = as_mapping(as_mapping(root_tree.get("targets")).get(target))
    if section.get("mode") != "production" or as_mapping(section.get("workspace")).get("root_path"):
        return []
    jobs = as_mapping(as_mapping(tree.get("resources")).get("jobs")).values()
    run_as_set = bool(tree.get("run_as")) or all(isinstance(job, dict) and job.get("run_as") for job in jobs)
    why = ("every job runs as a set identity, so the CLI only recommends it" if run_as_set else
           "the CLI refuses to deploy it as a user, and only recommends it to a service principal")
    return [Finding("production-without-root-path",
                    f"target {target!r} is in production mode but does not set its own workspace.root_path ({why}): "
                    "its deployment would land in a folder tied to whoever deploys it",
                    f"set targets.{target}.workspace.root_path, e.g. /Workspace/Shared/.bundle/${{bundle.name}}/"
                    "${bundle.target} (or a service principal's home)", file=file_at(root_tree, ("targets", target)),
                    path=format_path(("targets", target)), severity="warning")]


TARGET_MODES = ("development", "production")


def target_mode_findings(mode: Any, target: str, file: str | None) -> list[Finding]:
    """A target's `mode` is development or production, or not set: the CLI stops on any other
    (bundle/config/mutator/resourcemutator/validate_target_mode.go: "unsupported value ... specified for 'mode'")."""
    # A mapping or a list the loader drops with a warning (libs/dyn/convert/normalize.go); a reference resolves first.
    if mode in (None, "") or mode in TARGET_MODES or isinstance(mode, (dict, list)) or "${" in str(mode):
        return []
    text = ("true" if mode else "false") if isinstance(mode, bool) else str(mode)
    return [Finding("unsupported-mode", f"target {target!r} has mode {text!r}: the CLI stops (\"unsupported value "
                    "specified for 'mode'\")", "set mode: development or mode: production (or leave it out)",
                    file=file, path=format_path(("targets", target, "mode")))]


def default_target_findings(root_tree: Mapping) -> list[Finding]:
    defaults = [str(name) for name, target in as_mapping(root_tree.get("targets")).items()
                if as_mapping(target).get("default") is True]
    if len(defaults) < 2:
        return []
    return [Finding("several-default-targets", f"targets {', '.join(defaults)} are all marked default: true",
                    "mark one target (usually dev) as default: true", path=format_path(("targets", name, "default")))
            for name in defaults[1:]]


WORKSPACE_PATHS = ("root_path", "file_path", "state_path", "resource_path")


def volume_workspace_path_findings(tree: Mapping) -> list[Finding]:
    """Only `workspace.artifact_path` may lie in a volume: the CLI stops on any other workspace path under /Volumes
    (bundle/config/validate/validate_volume_path.go; after root_path, the paths below it are not checked)."""
    findings = []
    workspace = as_mapping(tree.get("workspace"))
    for field in WORKSPACE_PATHS:
        value = workspace.get(field)
        if isinstance(value, str) and value.startswith("/Volumes/"):
            findings.append(Finding("workspace-path-in-volume", f"workspace.{field} {value} is in a volume: the CLI "
                                    "stops (\"/Volumes can only be used with workspace.artifact_path\")",
                                    f"set workspace.{field} to a /Workspace path (e.g. /Workspace/Shared/.bundle/"
                                    "${bundle.name}/${bundle.target}); a volume may hold the artifacts "
                                    "(workspace.artifact_path)", path=f"workspace.{field}"))
            if field == "root_path":
                break
    return findings
