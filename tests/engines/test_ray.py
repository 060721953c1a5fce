"""Ray Train for real: Ray on Spark on a local Spark with executors of their own, through the `train` command.

Each run goes through `train --engine ray --local` in a fresh interpreter (one SparkContext per process, and the
master must be local-cluster[...]). The command runs in-process there, and while that process still lives the test
looks for Ray processes left behind: after a success and after a failure inside training, none may remain.
Quality is asserted as for TorchDistributor: the held-out RMSE at least 3 times below predicting the training mean.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from distributed_training.config import Config
from distributed_training.data.staging import stage
from distributed_training.engines.ray import RayPlacement, fit, ray_placement, ray_running
from distributed_training.task_interface import load_task
from distributed_training.training.checkpoints import tag_of

from conftest import FARE, LANGUAGE, SOURCE, assert_it_learned

EPOCHS = 3


def ray_processes(marker: str) -> list[str]:
    """The Ray processes of one run, known by the marker in their environment (every process the run starts
    inherits it): node daemons, Ray on Spark's node starters, Ray workers. Other runs on the machine do not count."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                if marker.encode() not in file.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/comm") as file:
                name = file.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                arguments = file.read().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if name in ("raylet", "gcs_server") or "ray.util.spark.start_ray_node" in arguments \
                or arguments[0].startswith("ray::"):
            found.append(f"{pid} {' '.join(arguments)[:200]}")
    return found


# Runs `train` in a fresh interpreter, then reports whether Ray is still up in it and which of the run's Ray
# processes remain while that interpreter still lives. A node's agents outlive it by a minute or so (they try to
# report its end to the stopped GCS until that times out), so 300 seconds are allowed (150 were enough on 2 quiet
# cores); a cluster never shut down keeps its GCS and raylets as long as the driver lives, and is caught.
PROBE = "import json, os, sys, time\n" + inspect.getsource(ray_processes) + """
from distributed_training.launch import main

exit_code = main(sys.argv[1:])
import ray
marker = "RUN_MARKER=" + os.environ["RUN_MARKER"]
deadline = time.monotonic() + 300
while ray_processes(marker) and time.monotonic() < deadline:
    time.sleep(1)
print("PROBE " + json.dumps({"ray_initialized": ray.is_initialized(), "leftover": ray_processes(marker)}), flush=True)
sys.exit(exit_code)
"""


def train_with_ray(output_dir: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "RUN_MARKER": uuid.uuid4().hex,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, "--engine", "ray", "--task", FARE, "--local", "--output-dir", str(output_dir),
         "--epochs", str(EPOCHS), *options],
        capture_output=True, text=True, env=environment, timeout=1500,  # 3 minutes on 2 quiet cores, with the wait
    )
    probes = [line for line in completed.stdout.splitlines() if line.startswith("PROBE ")]
    assert probes, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed, json.loads(probes[-1].removeprefix("PROBE "))


@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_ray_on_spark_trains_with_two_workers_and_leaves_nothing_running(tmp_path):
    completed, probe = train_with_ray(tmp_path)
    output = completed.stdout[-3000:] + completed.stderr[-3000:]
    assert completed.returncode == 0, output
    assert ("Trained with ray: Ray Train TorchTrainer, 2 CPU worker(s) on Ray on Spark, 2 worker node(s) of 1 CPU(s) "
            "and 0 GPU(s)") in completed.stdout, output
    assert not probe["ray_initialized"] and probe["leftover"] == [], "\n".join(probe["leftover"])

    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(metrics["epochs"]) == EPOCHS
    assert_it_learned(metrics, FARE)
    # The loop's checkpoints, where every engine writes them; Ray Train registered the last one there (no copy).
    last = tmp_path / "checkpoints" / tag_of(metrics["step"])
    assert (last / "state.pt").exists() and (last / "complete.json").exists()
    assert not [path for path in (tmp_path / "checkpoints").glob("checkpoint_*") if path.is_dir()]
    registered = json.loads((tmp_path / "checkpoints" / "checkpoint_manager_snapshot.json").read_text())
    assert [result["checkpoint_dir_name"] for result in registered["checkpoint_results"]] == [last.name]
    assert any((tmp_path / "ray-logs").rglob("*")), "Ray on Spark collected no logs"


@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_a_failure_inside_training_shuts_ray_down_and_comes_back_as_one_line(tmp_path):
    """More micro-batches per update than a rank has: the loop raises on every Ray Train worker (the language task's,
    whose blocks of tokens staging does not count: it refuses the fare task's before any worker starts)."""
    completed, probe = train_with_ray(tmp_path, "--task", LANGUAGE, "--grad-accumulation", "100000")
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    error = completed.stderr.splitlines()[-1]
    assert error.startswith("error: training failed in the worker processes (Ray Train TorchTrainer, 2 CPU worker(s)")
    assert "ValueError" in error and "fewer than one accumulation window of 100000" in error
    assert not probe["ray_initialized"] and probe["leftover"] == [], "\n".join(probe["leftover"])


@pytest.mark.engine
def test_the_language_model_trains_under_ray_train_on_one_node_and_a_retry_resumes(spark, staged_run):
    """One node: plain ray.init() on the driver, two Ray Train workers running the shared loop. A retry of a run
    whose last epoch never completed (its checkpoint gone) resumes from the one before and ends as the first did.
    Ctrl-C is the interpreter's again afterwards (Ray Train's fit() leaves its own handler behind)."""
    import shutil
    import signal

    ctrl_c = signal.getsignal(signal.SIGINT)

    config = staged_run(LANGUAGE, engine="ray", epochs=3)
    stage(spark, load_task(LANGUAGE), config, 2)
    where = RayPlacement(workers=2, use_gpu=False, worker_nodes=0)
    with ray_running(where, logs_dir=str(tmp_logs(config))):
        metrics = fit(config, {}, where)
        assert metrics["world_size"] == 2 and metrics["resumed_from_step"] is None
        assert_it_learned(metrics, LANGUAGE)

        shutil.rmtree(Path(config.checkpoint_dir) / tag_of(metrics["step"]))
        retried = fit(config, {}, where)
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    assert retried["resumed_from_step"] == 2 * metrics["updates_per_epoch"]
    assert [epoch["train_loss"] for epoch in retried["epochs"]] == pytest.approx(
        [epoch["train_loss"] for epoch in metrics["epochs"]], rel=1e-5)
    assert retried["held_out_loss"] == pytest.approx(metrics["held_out_loss"], rel=1e-5)


def tmp_logs(config):
    return Path(config.output_dir, "ray-logs")


def config(**changes) -> Config:
    base = dict(engine="ray", task=FARE, output_dir="/Volumes/c/s/v/run", gpus_per_node=0)
    return Config(**{**base, **changes})


def test_one_node_is_plain_ray_on_the_driver_one_worker_per_gpu():
    where = ray_placement(config(gpus_per_node=4))
    assert (where.on_spark, where.workers, where.use_gpu) == (False, 4, True)
    assert where.describe() == "Ray Train TorchTrainer, 4 GPU worker(s) on the driver (ray.init)"


def test_a_cluster_with_workers_is_ray_on_spark_nodes_as_large_as_the_node_type():
    where = ray_placement(config(num_nodes=3, gpus_per_node=2, on_workers=True), node_vcpus=24)
    assert (where.worker_nodes, where.workers, where.cpus_per_node, where.gpus_per_node) == (3, 6, 24, 2)
    where = ray_placement(config(gpus_per_node=4, on_workers=True), node_vcpus=48)  # one worker beside the driver
    assert (where.worker_nodes, where.workers, where.cpus_per_node, where.gpus_per_node) == (1, 4, 48, 4)
    assert where.describe() == ("Ray Train TorchTrainer, 4 GPU worker(s) on Ray on Spark, 1 worker node(s) of 48 "
                                "CPU(s) and 4 GPU(s)")


def test_an_unknown_node_type_leaves_both_counts_to_ray():
    """Ray on Spark takes CPU and GPU counts together or not at all."""
    where = ray_placement(config(num_nodes=2, gpus_per_node=1, on_workers=True), node_vcpus=None)
    assert (where.cpus_per_node, where.gpus_per_node, where.worker_nodes) == (None, None, 2)


def test_local_runs_one_cpu_ray_node_per_worker():
    where = ray_placement(config(local=True, processes=3))
    assert (where.worker_nodes, where.workers, where.cpus_per_node, where.gpus_per_node, where.use_gpu) == \
        (3, 3, 1, 0, False)
