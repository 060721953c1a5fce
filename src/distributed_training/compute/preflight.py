"""Preflight: before any training starts, what the job asked for against what the cluster really has.

Run at the start of `train` on the driver. The cluster's own settings go through the same guards as the template
answers and `validate`; on top, the hardware the ranks run on, the driver's or the executors', must match the job's."""

from dataclasses import dataclass

from ..findings import Finding
from .requirements import REQUIREMENTS
from .guards import ClusterRequest, check_cluster

# Cluster facts that Databricks exposes as Spark confs on every cluster.
NODE_TYPE_CONF = "spark.databricks.clusterUsageTags.clusterNodeType"  # the workers'
DRIVER_NODE_TYPE_CONF = "spark.databricks.clusterUsageTags.driverNodeType"
WORKERS_CONF = "spark.databricks.clusterUsageTags.clusterWorkers"
SPARK_VERSION_CONF = "spark.databricks.clusterUsageTags.sparkVersion"  # e.g. 17.3.x-gpu-ml-scala2.13
EXECUTOR_GPUS_CONF = "spark.executor.resource.gpu.amount"  # a worker's GPUs, on a GPU cluster with workers


@dataclass(frozen=True)
class TrainingRequest:
    engine: str
    num_nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class ObservedCluster:
    master: str
    driver_gpus: int
    workers: int  # worker nodes (executors on Databricks: one per worker)
    spark_conf: dict[str, str]
    node_type_id: str | None = None
    spark_version: str | None = None
    driver_node_type_id: str | None = None

    @property
    def single_node(self) -> bool:  # Spark's Utils.isLocalMaster: local-cluster[...] has executors of its own
        return self.master == "local" or self.master.startswith("local[")

    @property
    def trains_on_workers(self) -> bool:  # where the ranks run: a cluster with workers on them, else on the driver
        return not self.single_node and self.workers > 0


def observe(spark) -> ObservedCluster:
    import torch

    conf = {key: value for key, value in spark.sparkContext.getConf().getAll()}
    workers = conf.get(WORKERS_CONF)
    if workers is None:  # off Databricks: count the executors the driver knows, less the driver itself
        workers = max(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1, 0)
    return ObservedCluster(conf.get("spark.master", ""), torch.cuda.device_count(), int(workers), conf,
                           node_type_id=conf.get(NODE_TYPE_CONF), spark_version=conf.get(SPARK_VERSION_CONF),
                           driver_node_type_id=conf.get(DRIVER_NODE_TYPE_CONF))


def check(request: TrainingRequest, observed: ObservedCluster) -> list[Finding]:
    findings = list(_hardware_findings(request, observed))
    if observed.node_type_id and observed.spark_version:
        # use_ml_runtime=True: a cluster made with it may report its plain key, and a torch engine that got this far
        # imported torch, so its runtime is an ML one whatever the key says.
        workers = 0 if observed.single_node else observed.workers
        as_running = ClusterRequest(observed.node_type_id, workers, observed.spark_version, engines=(request.engine,),
                                    spark_conf=observed.spark_conf, use_ml_runtime=True,
                                    driver_node_type_id=observed.driver_node_type_id)
        # A node type missing from the catalog is not a reason to stop a job that is already running.
        findings += [finding for finding in check_cluster(as_running) if finding.rule != "unknown-node-type"]
    return findings


def _hardware_findings(request: TrainingRequest, observed: ObservedCluster):
    wants = f"the job asks for {request.num_nodes} node(s) x {request.gpus_per_node} GPU(s)"
    if request.num_nodes > 1 and observed.single_node:
        yield Finding("preflight-single-node-cluster", f"{wants}, but this is a single-node cluster "
                      f"(spark.master {observed.master})",
                      "pass --num-nodes 1, or give the job cluster num_workers equal to the nodes wanted")
    if request.num_nodes > 1 and not observed.single_node and observed.workers < request.num_nodes:
        yield Finding("preflight-too-few-workers", f"{wants}, but the cluster has {observed.workers} worker(s)",
                      f"pass --num-nodes {max(observed.workers, 1)}, or raise the job cluster's num_workers")
    # the GPUs of the node(s) the ranks run on (None: not known)
    gpus = observed.spark_conf.get(EXECUTOR_GPUS_CONF) if observed.trains_on_workers else observed.driver_gpus
    if gpus is not None and int(float(gpus)) < request.gpus_per_node:
        seen = f"each executor ({EXECUTOR_GPUS_CONF}) has" if observed.trains_on_workers else "the driver sees"
        yield Finding("preflight-gpus-missing", f"{wants}, but {seen} {gpus} GPU(s)",
                      f"pass --gpus-per-node {gpus}, or use a node type with {request.gpus_per_node} GPUs")
    if observed.trains_on_workers and request.gpus_per_node > 0:
        wanted = REQUIREMENTS[request.engine].task_gpu_amount if request.engine in REQUIREMENTS else None
        actual = observed.spark_conf.get("spark.task.resource.gpu.amount")
        if wanted is not None and actual is not None and float(actual) != float(wanted):
            yield Finding("preflight-gpu-task-amount", f"{request.engine} needs spark.task.resource.gpu.amount "
                          f"{wanted} on a GPU cluster with workers; this cluster has {actual}",
                          f'set spark.task.resource.gpu.amount: "{wanted}" in the job cluster\'s spark_conf')


class PreflightError(RuntimeError):
    """The cluster cannot run the job as asked: every error found, each with its fix."""


def ensure_ready(spark, request: TrainingRequest, log=print) -> ObservedCluster:
    observed = observe(spark)
    findings = check(request, observed)
    for warning in (finding for finding in findings if not finding.is_error):
        log(str(warning))
    errors = [finding for finding in findings if finding.is_error]
    if errors:
        raise PreflightError("preflight failed, nothing was trained:\n" + "\n".join(str(error) for error in errors))
    return observed
