"""Guards: the platform's rules for training clusters, over the node-type catalog: one set of rules for the template's
answers, `validate` on a bundle's clusters, and each training run's preflight.

A multi-node cluster's driver is by default of the workers' type. Databricks' GPU docs for AWS require GPU driver and
worker types; Azure's no longer say so for the driver, but none allows a CPU driver outright: beside GPU workers it is
an error on AWS, a warning elsewhere (though multi-node TorchDistributor and DeepSpeed leave the driver's GPUs idle)."""

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..findings import Finding
from .catalog import Catalog, NodeType, default_catalog
from .requirements import ENGINES, REQUIREMENTS, SPARK_ML_CONNECT
from .runtime import Runtime, effective, parse_runtime, version_text, versions

STANDARD_MODES = ("USER_ISOLATION", "DATA_SECURITY_MODE_STANDARD")
# Custom tag on a cluster that records the user's "I know this node type" answer.
OVERRIDE_TAG = "allow_unknown_node_type"
At = Callable[[str], str]  # at(field): where a finding points (the field's path in the bundle, or the answer's name)


@dataclass(frozen=True)
class ClusterRequest:
    """A training cluster as a job asks for it (from template answers, a bundle, or the cluster itself)."""

    node_type_id: str
    num_workers: int
    spark_version: str
    engines: tuple[str, ...] = ()
    cloud: str | None = None
    data_security_mode: str | None = None
    runtime_engine: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    allow_unknown_node_type: bool = False
    use_ml_runtime: bool = False
    driver_node_type_id: str | None = None


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def check_cluster(request: ClusterRequest, path: str | None = None, catalog: Catalog | None = None) -> list[Finding]:
    """Every finding for one cluster. `path` is where the cluster sits in a bundle (None: answer names)."""
    catalog = catalog or default_catalog()
    at: At = lambda leaf: f"{path}.{leaf}" if path else leaf  # noqa: E731
    node = None if is_reference(request.node_type_id) else catalog.find(request.node_type_id)
    runtime = None if is_reference(request.spark_version) else parse_runtime(request.spark_version)
    findings: list[Finding] = []
    if node is None and not is_reference(request.node_type_id):
        findings.append(_unknown_node_type(request, catalog, at("node_type_id")))
    if runtime is None and not is_reference(request.spark_version):
        findings.append(Finding(
            "unknown-spark-version", f"spark_version {request.spark_version!r} is not a Databricks Runtime version",
            f"use a version string such as {versions()['runtime']} (with use_ml_runtime: true for ML); "
            "`databricks clusters spark-versions` lists them", path=at("spark_version")))
    if node is not None:
        findings += _node_rules(request, node, catalog, at)
    if runtime is not None:
        runtime = effective(runtime, request.use_ml_runtime, node is not None and node.has_gpu)
        findings += _runtime_rules(request, node, runtime, at)
        for engine in request.engines:
            findings += _engine_rules(engine, request, node, runtime, at)
    return findings


def _unknown_node_type(request: ClusterRequest, catalog: Catalog, path: str) -> Finding:
    closest = catalog.closest(request.node_type_id, request.cloud) or catalog.closest(request.node_type_id)
    cloud = f" for {request.cloud}" if request.cloud else ""
    message = f"node type {request.node_type_id!r} is not in the catalog{cloud}"
    if request.allow_unknown_node_type:
        return Finding("unknown-node-type", message + "; accepted because unknown node types were allowed",
                       "check its GPUs and network yourself: no guard can", path=path, severity="warning")
    suggestion = f"did you mean {', '.join(closest)}? Otherwise add" if closest else "Add"
    return Finding("unknown-node-type", message,
                   f"{suggestion} it to compute/node_types.yaml, or answer allow_unknown_node_type=yes "
                   f"(recorded as the cluster's custom tag {OVERRIDE_TAG}) if you know it is right", path=path)


def _node_rules(request: ClusterRequest, node: NodeType, catalog: Catalog, at: At) -> Iterator[Finding]:
    if node.retired:
        yield Finding("retired-node-type", f"{node.id} was retired by {node.cloud} on {node.retired.date} "
                      f"({node.retired.source}): a cluster of it cannot start",
                      f"use {', '.join(node.retired.replacements)} (or another current size of the catalog)",
                      path=at("node_type_id"))
        return
    largest = max((member for member in catalog.family(node.family) if not member.retired), key=lambda m: m.gpus)
    single_node_fix = f"num_workers: 0 on {largest.id} ({largest.gpus} x {largest.gpu_model})"
    if request.cloud and node.cloud != request.cloud:
        yield Finding("node-type-wrong-cloud", f"{node.id} is an {node.cloud} node type, not {request.cloud}",
                      f"pick a {request.cloud} node type, or answer cloud={node.cloud}", path=at("node_type_id"))
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
    driver = catalog.find(request.driver_node_type_id or "")
    if driver is not None and node.has_gpu and not driver.has_gpu and request.num_workers > 0:
        yield Finding("cpu-driver-gpu-workers", f"driver {driver.id} has no GPU beside GPU workers of {node.id}: "
                      "Databricks' GPU docs ask for GPU driver and worker types" +
                      ("" if node.cloud == "aws" else " (on AWS; unconfirmed elsewhere)"),
                      f"drop driver_node_type_id (the driver is then a {node.id})", path=at("driver_node_type_id"),
                      severity="error" if node.cloud == "aws" else "warning")
    elif driver is not None and node.has_gpu and driver.gpu_model != node.gpu_model and request.num_workers > 0:
        yield Finding("driver-gpu-model", f"driver {driver.id} has {driver.gpu_model} GPUs, the workers {node.id} "
                      f"{node.gpu_model}: the precision follows the driver's", "give the cluster a driver of the "
                      "workers' family, or pass --precision", path=at("driver_node_type_id"), severity="warning")


def _runtime_rules(request: ClusterRequest, node: NodeType | None, runtime: Runtime, at: At) -> Iterator[Finding]:
    gpu_node = node is not None and node.has_gpu
    if gpu_node and not runtime.gpu:
        yield Finding("gpu-node-cpu-runtime", f"{node.id} has {node.gpus} GPU(s) but {runtime.spark_version} "
                      "runs without GPU support", f"set use_ml_runtime: true with {versions()['runtime']} (or a GPU "
                      "ML runtime key such as 17.3.x-gpu-ml-scala2.13)", path=at("spark_version"))
    if runtime.gpu and node is not None and not node.has_gpu:
        yield Finding("gpu-runtime-cpu-node", f"{runtime.spark_version} is a GPU runtime but {node.id} has no GPU",
                      "pick a GPU node type, or a CPU runtime", path=at("node_type_id"))
    if gpu_node and runtime.photon:
        yield Finding("photon-on-gpu", f"Photon is not supported on GPU node {node.id}",
                      f"use {versions()['runtime']} with use_ml_runtime: true", path=at("spark_version"))
    if request.data_security_mode in STANDARD_MODES and (runtime.ml or gpu_node):
        yield Finding("ml-on-standard-access", f"Standard access mode ({request.data_security_mode}) supports neither "
                      "ML runtimes nor GPUs", f"set data_security_mode: {versions()['access_modes']['dedicated']}",
                      path=at("data_security_mode"))
    if gpu_node and (request.runtime_engine or "").upper() == "PHOTON":
        yield Finding("photon-on-gpu", f"Photon is not supported on GPU node {node.id}",
                      "remove runtime_engine: PHOTON (or set STANDARD)", path=at("runtime_engine"))


def _engine_rules(engine: str, request: ClusterRequest, node: NodeType | None, runtime: Runtime,
                  at: At) -> Iterator[Finding]:
    if engine not in REQUIREMENTS:
        yield Finding("unknown-engine", f"engine {engine!r} is not one of {', '.join(ENGINES)}",
                      f"use one of {', '.join(ENGINES)}", path=at("engine"))
        return
    needs, ml_fix = REQUIREMENTS[engine], f"use {versions()['runtime']} with use_ml_runtime: true"
    if engine == SPARK_ML_CONNECT and not runtime.ml:
        if runtime.version < needs.min_standard_runtime:
            yield Finding("runtime-too-old", f"Spark ML through Spark Connect needs Databricks Runtime "
                          f"{version_text(needs.min_standard_runtime)}+ on a standard runtime; "
                          f"{runtime.spark_version} is {runtime.label}",
                          f"use {versions()['runtime']} with Standard access, or an ML runtime (14.0+) with "
                          "dedicated access", path=at("spark_version"))
    elif not runtime.ml:
        yield Finding("engine-needs-ml-runtime", f"{engine} needs a Databricks Runtime ML; {runtime.spark_version} "
                      "is not one", ml_fix, path=at("spark_version"))
    elif runtime.version < needs.min_ml_runtime:
        yield Finding("runtime-too-old", f"{engine} needs Databricks Runtime {version_text(needs.min_ml_runtime)} ML "
                      f"or newer; {runtime.spark_version} is {runtime.label}", ml_fix, path=at("spark_version"))
    if node is None:
        return
    if needs.needs_gpu and not node.has_gpu:
        yield Finding("engine-needs-gpu", f"{engine} needs GPU nodes; {node.id} has none",
                      "pick a GPU node type", path=at("node_type_id"))
    if node.has_gpu and not needs.uses_gpu:
        yield Finding("gpu-unused", f"{engine} trains on CPUs; the GPUs of {node.id} would sit idle",
                      "use a CPU node type (Standard_D8ds_v5, m5d.2xlarge, n2-standard-8)",
                      path=at("node_type_id"), severity="warning")
    wanted, actual = needs.task_gpu_amount, request.spark_conf.get("spark.task.resource.gpu.amount")
    if node.has_gpu and request.num_workers > 0 and wanted is not None and actual != wanted:
        yield Finding("gpu-task-amount", f"{engine} on a multi-node GPU cluster needs spark.task.resource.gpu.amount "
                      f"{wanted}; it is {actual if actual is not None else 'not set'}",
                      f'set spark.task.resource.gpu.amount: "{wanted}" in the cluster\'s spark_conf',
                      path=at("spark_conf"))
