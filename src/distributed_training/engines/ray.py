"""Train with Ray Train: the shared loop on every worker of a `TorchTrainer`, on a Ray cluster started for the run.

Where Ray runs, following the platform's advice (single node first):
- a single-node cluster: a Ray of its own on the driver (`ray.init(address="local")`), one training worker per GPU it
  has (or N CPU workers, --processes);
- a cluster with workers, even one: Ray on Spark (`ray.util.spark.setup_ray_cluster`), one Ray worker node per Spark
  worker, as large as the node type. Spark tasks must hold no GPU while Ray runs, so the job cluster keeps
  `spark.task.resource.gpu.amount` at 0 (the guards and the preflight check it). The Ray head node runs on the driver
  and trains nothing;
- `--local`: Ray on Spark on a local Spark whose executors are processes of their own (`local-cluster[N,1,2048]`).
Ray is shut down when training ends, either way; Ray on Spark collects its nodes' logs under the output folder.
Ray Train starts the process group the loop uses; the loop's checkpoints (OUTPUT_DIR/checkpoints) are Ray Train's
run folder as well, and the final one is registered with Ray Train where it lies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..data.staging import stage
from ..task_interface import load_task
from . import WAREHOUSE_DIR, Engine, LaunchError, TrainingRun, failures

RAY_LOGS_DIR = "ray-logs"  # where Ray on Spark collects its nodes' logs when the cluster shuts down
LOCAL_EXECUTOR_MEMORY_MB = 2048
# Ray on Spark connects its nodes without token authentication; a token file that an earlier plain `ray.init()`
# left in ~/.ray makes `ray start` turn it on for the head node alone, and the driver can then not connect.
RAY_AUTH_MODE = "RAY_AUTH_MODE"
PRINT_PATCH = "RAY_TRAIN_ENABLE_PRINT_PATCH"  # read by Ray Train's driver and handed on to its workers
RAY_RUN_RECORD = "checkpoint_manager_snapshot.json"  # Ray Train 2.x's record of a run's checkpoints
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds this package


@dataclass(frozen=True)
class RayPlacement:
    workers: int  # training workers, one process each
    use_gpu: bool  # one GPU per worker
    worker_nodes: int  # Ray worker nodes started on Spark; 0: plain ray.init() on the driver
    cpus_per_node: int | None = None  # the size of each Ray worker node; None for both: a whole Spark worker
    gpus_per_node: int | None = None

    @property
    def on_spark(self) -> bool:
        return self.worker_nodes > 0

    def describe(self) -> str:
        workers = f"Ray Train TorchTrainer, {self.workers} {'GPU' if self.use_gpu else 'CPU'} worker(s)"
        if not self.on_spark:
            return f"{workers} on the driver (ray.init)"
        size = "the size of a Spark worker" if self.cpus_per_node is None else \
            f"of {self.cpus_per_node} CPU(s) and {self.gpus_per_node} GPU(s)"
        return f"{workers} on Ray on Spark, {self.worker_nodes} worker node(s) {size}"


def ray_placement(config: Config, node_vcpus: int | None = None) -> RayPlacement:
    """Training workers and Ray nodes for a run. `node_vcpus`: the CPUs of one worker node from the catalog; None
    when its node type is unknown, and Ray on Spark then sizes its nodes as whole Spark workers."""
    where = config.placement
    if config.local:  # the multi-node path on this machine: one one-CPU Ray node per worker
        return RayPlacement(where.world_size, use_gpu=False, worker_nodes=where.world_size, cpus_per_node=1,
                            gpus_per_node=0)
    if not where.on_workers:
        return RayPlacement(where.world_size, where.use_gpu, worker_nodes=0)
    # Ray on Spark takes both counts or neither
    return RayPlacement(where.world_size, where.use_gpu, worker_nodes=where.nodes, cpus_per_node=node_vcpus,
                        gpus_per_node=None if node_vcpus is None else config.gpus_per_node)


class RayEngine(Engine):
    name = "ray"

    def local_session(self, config: Config):
        """One executor process per Ray worker node, so that Ray on Spark starts its nodes as on a cluster."""
        from .local_spark import local_spark_session

        nodes = ray_placement(config).worker_nodes
        os.environ.setdefault(RAY_AUTH_MODE, "disabled")  # before Spark starts: its executors inherit it
        _put_ray_command_on_path()
        return local_spark_session(
            cores=nodes, warehouse_dir=os.path.join(config.output_dir, WAREHOUSE_DIR),
            master=f"local-cluster[{nodes},1,{LOCAL_EXECUTOR_MEMORY_MB}]",
            # Spark gives its Python workers a PYTHONPATH of its own; the Ray nodes they start must import this package.
            executor_env={"PYTHONPATH": PACKAGE_PARENT, RAY_AUTH_MODE: os.environ[RAY_AUTH_MODE]},
        )

    def train(self, spark, config: Config, environment: dict[str, str]) -> TrainingRun:
        """Stage the data for the planned workers, start Ray, run the loop on every worker, shut Ray down."""
        where = ray_placement(config, None if config.local else _worker_vcpus(spark))
        stage(spark, load_task(config.task), config, where.workers)
        with ray_running(where, logs_dir=os.path.join(config.output_dir, RAY_LOGS_DIR)):
            metrics = fit(config, environment, where)
        return TrainingRun(where.describe(), metrics)


@contextlib.contextmanager
def ray_running(where: RayPlacement, logs_dir: str):
    """Ray up for the block (on Spark or on the driver), and down after it, however the block ends."""
    import ray

    if not where.on_spark:
        ray.init(address="local")  # a new Ray of its own, never one that another run on this machine started
        try:
            yield
        finally:
            ray.shutdown()
        return

    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    os.environ.setdefault(RAY_AUTH_MODE, "disabled")
    _put_ray_command_on_path()
    try:
        setup_ray_cluster(
            max_worker_nodes=where.worker_nodes,
            num_cpus_worker_node=where.cpus_per_node,
            num_gpus_worker_node=where.gpus_per_node,
            collect_log_to_path=logs_dir,
            head_node_options={} if _dashboard_can_start() else {"include_dashboard": False},
        )
    except Exception as error:  # Ray reports a cluster it cannot start in many shapes
        raise LaunchError(f"could not start Ray on Spark ({where.describe()}): "
                          f"{str(error).strip().splitlines()[0]}. Ray's output is above") from None
    try:
        ray.init()  # setup_ray_cluster exported the cluster's address as RAY_ADDRESS
        yield
    finally:
        ray.shutdown()
        shutdown_ray_cluster()


def fit(config: Config, environment: dict[str, str], where: RayPlacement) -> dict:
    """Run `training.loop.train(config)` on every Ray Train worker of a running Ray cluster; the metrics come back."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Ray Train would route the workers' prints through its logger as well as their output: each line twice.
    os.environ.setdefault(PRINT_PATCH, "0")
    # The loop resumes from its own checkpoints. Ray Train's record of an earlier attempt in the same folder names
    # checkpoints the loop may have pruned or found incomplete since, and Ray refuses to start on such a record.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(config.checkpoint_dir, RAY_RUN_RECORD))
    trainer = TorchTrainer(
        _train_on_worker,
        train_loop_config={"config": config, "environment": environment},
        scaling_config=ScalingConfig(num_workers=where.workers, use_gpu=where.use_gpu),
        run_config=RunConfig(name=os.path.basename(config.checkpoint_dir),
                             storage_path=os.path.dirname(config.checkpoint_dir),
                             failure_config=FailureConfig(max_failures=0)),
    )
    with _ctrl_c_handler_kept():
        return failures.reported(lambda: trainer.fit().metrics, config.output_dir, where.describe())


@contextlib.contextmanager
def _ctrl_c_handler_kept():
    """Ray Train's fit() installs a SIGINT handler that aborts its run controller and leaves it installed: after the
    run, Ctrl-C (a notebook's interrupt button) would call an actor that is gone. The handler before it comes back."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)


def _train_on_worker(loop_config: dict) -> None:
    """What every Ray Train worker runs: the shared loop, then the run's metrics and final checkpoint reported."""
    import ray.train

    from ..training.checkpoints import complete_steps, tag_of
    from ..training.loop import train as train_on_every_rank

    config: Config = loop_config["config"]
    metrics = failures.run_recording_failure(train_on_every_rank, failures.folder(config.output_dir), config,
                                             loop_config["environment"])
    final = None
    if ray.train.get_context().get_world_rank() == 0:  # the loop always checkpoints its last step
        final = ray.train.Checkpoint(os.path.join(config.checkpoint_dir, tag_of(complete_steps(config.checkpoint_dir)[0])))
    upload = getattr(ray.train, "CheckpointUploadMode", None)
    if upload is None:  # a Ray Train older than 2.50 copies it into the same folder, as checkpoint_NNNNNN
        ray.train.report(metrics, checkpoint=final)
    else:
        ray.train.report(metrics, checkpoint=final, checkpoint_upload_mode=upload.NO_UPLOAD)


def _worker_vcpus(spark) -> int | None:
    """The CPUs of one worker node of this cluster, from the catalog (None off Databricks or for unknown types)."""
    from ..compute.catalog import default_catalog
    from ..compute.preflight import NODE_TYPE_CONF

    node = default_catalog().find(spark.conf.get(NODE_TYPE_CONF, ""))
    return node.vcpus if node is not None else None


def _dashboard_can_start() -> bool:
    """The dashboard needs ray[default]'s packages; without them Ray on Spark waits a minute for it in vain."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


def _put_ray_command_on_path() -> None:
    """Ray on Spark starts its nodes with the `ray` command; an interpreter run from an unactivated virtual
    environment has it beside itself but not on PATH."""
    beside_python = Path(sys.executable).with_name("ray")
    if shutil.which("ray") is None and beside_python.exists():
        os.environ["PATH"] = os.pathsep.join([str(beside_python.parent), os.environ.get("PATH", "")])


ENGINE = RayEngine()
