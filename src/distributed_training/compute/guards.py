"""Guards: the platform's rules for training clusters, over the node-type catalog.

One set of rules, applied in three places: the template's pre-generation hook (through `answers`), `validate`
on any bundle (`check_bundle_clusters`) and the preflight at the start of a training run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..findings import Finding
from .catalog import Catalog, NodeType, default_catalog
from .engines import ENGINES, REQUIREMENTS, SPARK_ML_CONNECT
from .runtime import Runtime, parse_runtime, version_text

STANDARD_MODES = ("USER_ISOLATION", "DATA_SECURITY_MODE_STANDARD")
# Custom tag on a cluster that records the user's "I know this node type" answer.
OVERRIDE_TAG = "allow_unknown_node_type"


@dataclass(frozen=True)
class ClusterRequest:
    """A training cluster as a job asks for it (built from template answers or read back from a bundle)."""

    node_type_id: str
    num_workers: int
    spark_version: str
    engines: tuple[str, ...] = ()
    cloud: str | None = None
    data_security_mode: str | None = None
    runtime_engine: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    allow_unknown_node_type: bool = False


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def request_from_cluster(cluster: dict, engines: tuple[str, ...] = (), cloud: str | None = None) -> ClusterRequest:
    """Read a `new_cluster` mapping (as in a bundle) back into a request. Unresolved `${...}` values stay as text;
    malformed parts (the schema's findings) are read as absent."""
    num_workers = cluster.get("num_workers", 0)
    autoscale = _mapping(cluster.get("autoscale"))
    if "max_workers" in autoscale:
        num_workers = autoscale["max_workers"]
    return ClusterRequest(
        node_type_id=str(cluster.get("node_type_id", "")),
        num_workers=num_workers if isinstance(num_workers, int) else 0,
        spark_version=str(cluster.get("spark_version", "")),
        engines=engines,
        cloud=cloud,
        data_security_mode=cluster.get("data_security_mode"),
        runtime_engine=cluster.get("runtime_engine"),
        spark_conf={str(key): str(value) for key, value in _mapping(cluster.get("spark_conf")).items()},
        allow_unknown_node_type=str(_mapping(cluster.get("custom_tags")).get(OVERRIDE_TAG, "")).lower() == "true",
    )


def check_cluster(request: ClusterRequest, path: str | None = None, catalog: Catalog | None = None) -> list[Finding]:
    """Every finding for one cluster. `path` is where the cluster sits in a bundle (None: answer names)."""
    catalog = catalog or default_catalog()

    def at(leaf: str) -> str:
        return f"{path}.{leaf}" if path else leaf

    node = None if is_reference(request.node_type_id) else catalog.find(request.node_type_id)
    runtime = None if is_reference(request.spark_version) else parse_runtime(request.spark_version)
    findings: list[Finding] = []
    if node is None and not is_reference(request.node_type_id):
        findings.append(_unknown_node_type(request, catalog, at("node_type_id")))
    if runtime is None and not is_reference(request.spark_version):
        findings.append(Finding(
            "unknown-spark-version", f"spark_version {request.spark_version!r} is not a Databricks Runtime version",
            "use a version string such as 17.3.x-gpu-ml-scala2.13 (GPU ML) or 17.3.x-cpu-ml-scala2.13 (CPU ML); "
            "`databricks clusters spark-versions` lists them", path=at("spark_version")))
    if node is not None:
        findings += _node_rules(request, node, catalog, at)
    if node is not None and runtime is not None:
        findings += _node_runtime_rules(node, runtime, at)
    if runtime is not None:
        findings += _access_rules(request, node, runtime, at)
        for engine in request.engines:
            findings += _engine_rules(engine, request, node, runtime, at)
    return findings


def _unknown_node_type(request: ClusterRequest, catalog: Catalog, path: str) -> Finding:
    closest = catalog.closest(request.node_type_id, request.cloud) or catalog.closest(request.node_type_id)
    message = f"node type {request.node_type_id!r} is not in the catalog" + (f" for {request.cloud}" if request.cloud else "")
    if request.allow_unknown_node_type:
        return Finding("unknown-node-type", message + "; accepted because unknown node types were allowed",
                       "check its GPUs and network yourself: no guard can", path=path, severity="warning")
    suggestion = f"did you mean {', '.join(closest)}? " if closest else ""
    return Finding("unknown-node-type", message,
                   f"{suggestion}Otherwise add it to compute/node_types.yaml, or answer allow_unknown_node_type=yes "
                   f"(recorded as the cluster's custom tag {OVERRIDE_TAG}) if you know it is right", path=path)


def _node_rules(request: ClusterRequest, node: NodeType, catalog: Catalog, at: Callable[[str], str]) -> Iterator[Finding]:
    largest = max(catalog.family(node.family), key=lambda member: member.gpus)
    single_node_fix = f"num_workers: 0 on {largest.id} ({largest.gpus} x {largest.gpu_model})"
    if request.cloud and node.cloud != request.cloud:
        yield Finding("node-type-wrong-cloud", f"{node.id} is an {node.cloud} node type, not {request.cloud}",
                      f"pick a {request.cloud} node type, or set cloud={node.cloud}", path=at("node_type_id"))
    if request.num_workers > 0 and node.has_gpu:
        workers = f"{request.num_workers} worker{'s' if request.num_workers > 1 else ''} of {node.id}"
        if node.multi_node == "refuse" and node.cloud == "azure" and node.family.startswith("NC"):
            yield Finding("azure-nc-multi-node", f"multi-node training on Azure NC-series ({workers}): {node.reason}",
                          f"use one multi-GPU node instead ({single_node_fix}), or a size with accelerated "
                          "networking such as Standard_NC64as_T4_v3 (NCasT4_v3) if you need several nodes",
                          path=at("num_workers"))
        elif node.multi_node == "refuse":
            yield Finding("multi-node-refused", f"multi-node training ({workers}): {node.reason}",
                          f"use one multi-GPU node ({single_node_fix})", path=at("num_workers"))
        elif node.multi_node == "warn":
            yield Finding("multi-node-unproven", f"{workers}: {node.reason}",
                          f"train on one multi-GPU node while the model and data fit ({single_node_fix})",
                          path=at("num_workers"), severity="warning")
    if node.multi_gpu_broken and (node.gpus > 1 or request.num_workers > 0):
        yield Finding("multi-gpu-broken", f"{node.id}: {node.notes}",
                      "use a single-GPU size of the family, or another family", path=at("node_type_id"))


def _node_runtime_rules(node: NodeType, runtime: Runtime, at: Callable[[str], str]) -> Iterator[Finding]:
    if node.has_gpu and not runtime.gpu:
        yield Finding("gpu-node-cpu-runtime", f"{node.id} has {node.gpus} GPU(s) but {runtime.spark_version} "
                      "has no GPU support", "use a GPU ML runtime such as 17.3.x-gpu-ml-scala2.13",
                      path=at("spark_version"))
    if runtime.gpu and not node.has_gpu:
        yield Finding("gpu-runtime-cpu-node", f"{runtime.spark_version} is a GPU runtime but {node.id} has no GPU",
                      "pick a GPU node type, or a CPU runtime such as 17.3.x-cpu-ml-scala2.13",
                      path=at("node_type_id"))
    if node.has_gpu and runtime.photon:
        yield Finding("photon-on-gpu", f"Photon is not supported on GPU node {node.id}",
                      "use a GPU ML runtime without Photon such as 17.3.x-gpu-ml-scala2.13", path=at("spark_version"))


def _access_rules(request: ClusterRequest, node: NodeType | None, runtime: Runtime,
                  at: Callable[[str], str]) -> Iterator[Finding]:
    if request.data_security_mode in STANDARD_MODES and (runtime.ml or (node is not None and node.has_gpu)):
        yield Finding("ml-on-standard-access",
                      f"Standard access mode ({request.data_security_mode}) supports neither ML runtimes nor GPUs",
                      "set data_security_mode: SINGLE_USER (dedicated access)", path=at("data_security_mode"))
    if node is not None and node.has_gpu and (request.runtime_engine or "").upper() == "PHOTON":
        yield Finding("photon-on-gpu", f"Photon is not supported on GPU node {node.id}",
                      "remove runtime_engine: PHOTON (or set STANDARD)", path=at("runtime_engine"))


def _engine_rules(engine: str, request: ClusterRequest, node: NodeType | None, runtime: Runtime,
                  at: Callable[[str], str]) -> Iterator[Finding]:
    if engine not in REQUIREMENTS:
        yield Finding("unknown-engine", f"engine {engine!r} is not one of {', '.join(ENGINES)}",
                      f"use one of {', '.join(ENGINES)}", path=at("engine"))
        return
    needs = REQUIREMENTS[engine]
    if engine == SPARK_ML_CONNECT and not runtime.ml:
        if runtime.version < needs.min_standard_runtime:
            yield Finding("runtime-too-old", f"Spark ML through Spark Connect needs Databricks Runtime "
                          f"{version_text(needs.min_standard_runtime)}+ on a standard runtime; "
                          f"{runtime.spark_version} is {runtime.label}",
                          "use 17.3.x-scala2.13 (17.3 LTS) with Standard access, or a 14.0+ ML runtime with "
                          "dedicated access", path=at("spark_version"))
    elif not runtime.ml:
        yield Finding("engine-needs-ml-runtime", f"{engine} needs a Databricks Runtime ML; {runtime.spark_version} "
                      "is not one", "use 17.3.x-gpu-ml-scala2.13 (GPU) or 17.3.x-cpu-ml-scala2.13 (CPU)",
                      path=at("spark_version"))
    elif runtime.version < needs.min_ml_runtime:
        yield Finding("runtime-too-old", f"{engine} needs Databricks Runtime {version_text(needs.min_ml_runtime)} ML "
                      f"or newer; {runtime.spark_version} is {runtime.label}",
                      "use 17.3.x-gpu-ml-scala2.13 (17.3 LTS ML)", path=at("spark_version"))
    if node is None:
        return
    if needs.needs_gpu and not node.has_gpu:
        yield Finding("engine-needs-gpu", f"{engine} needs GPU nodes; {node.id} has none",
                      "pick a GPU node type and a GPU ML runtime (17.3.x-gpu-ml-scala2.13)", path=at("node_type_id"))
    if node.has_gpu and not needs.uses_gpu:
        yield Finding("gpu-unused", f"{engine} trains on CPUs; the GPUs of {node.id} would sit idle",
                      "use a CPU node type (Standard_D8ds_v5, m5d.2xlarge, n2-standard-8)",
                      path=at("node_type_id"), severity="warning")
    wanted = needs.task_gpu_amount
    actual = request.spark_conf.get("spark.task.resource.gpu.amount")
    if node.has_gpu and request.num_workers > 0 and wanted is not None and actual != wanted:
        yield Finding("gpu-task-amount", f"{engine} on a multi-node GPU cluster needs spark.task.resource.gpu.amount "
                      f"{wanted}; it is {actual if actual is not None else 'not set'}",
                      f'set spark.task.resource.gpu.amount: "{wanted}" in the cluster\'s spark_conf', path=at("spark_conf"))


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def task_engine(task: dict) -> str | None:
    """The `--engine` a task's `train` wheel task is given, if any."""
    parameters = _list(_mapping(task.get("python_wheel_task")).get("parameters"))
    for flag, value in zip(parameters, parameters[1:]):
        if flag == "--engine":
            return str(value)
    return None


def check_bundle_clusters(tree: dict, catalog: Catalog | None = None) -> list[Finding]:
    """Findings for every job cluster of a merged bundle tree (one target), with `path` set inside the tree."""
    findings: list[Finding] = []
    for job_key, job in _mapping(_mapping(tree.get("resources")).get("jobs")).items():
        if not isinstance(job, dict):
            continue
        tasks = [task for task in _list(job.get("tasks")) if isinstance(task, dict)]
        engines_by_cluster: dict[str, list[str]] = {}
        for index, task in enumerate(tasks):
            engine = task_engine(task)
            if engine and isinstance(task.get("job_cluster_key"), str):
                engines_by_cluster.setdefault(task["job_cluster_key"], []).append(engine)
            if isinstance(task.get("new_cluster"), dict):
                request = request_from_cluster(task["new_cluster"], (engine,) if engine else ())
                findings += check_cluster(request, f"resources.jobs.{job_key}.tasks[{index}].new_cluster", catalog)
        for index, job_cluster in enumerate(_list(job.get("job_clusters"))):
            if not isinstance(job_cluster, dict) or not isinstance(job_cluster.get("new_cluster"), dict):
                continue
            key = job_cluster.get("job_cluster_key")
            engines = tuple(dict.fromkeys(engines_by_cluster.get(key, []))) if isinstance(key, str) else ()
            request = request_from_cluster(job_cluster["new_cluster"], engines)
            findings += check_cluster(request, f"resources.jobs.{job_key}.job_clusters[{index}].new_cluster", catalog)
    return findings
