"""Engine overhead: each engine path against a plain `torchrun` of the same loop, on the same staged data and model.

Two figures per engine, both from the loop's own metrics:
- steady-state throughput: training samples per second over all ranks after the first epoch (ratio to torchrun);
- start-up and teardown: the wall time of the whole path less the loop's own time (process launch, process
  group, distributor, Ray cluster, DeepSpeed initialisation...), against the same for torchrun.
The local Spark session and the staging are measured once: every Spark-based engine pays them, torchrun does not.

TorchDistributor runs on the data staged for torchrun. An engine whose launcher module exists besides it
(deepspeed, ray) runs through its own `train(spark, settings)`, which stages again: the staging time measured
here is taken off its start-up. Spark ML (Connect) trains no torch loop and has only a wall time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .measure import Row, alternate, median, seconds

SOURCE = Path(__file__).resolve().parents[1] / "src"
PROCESSES = 2
TORCH_LOOP_ENGINES = ("deepspeed", "ray")  # besides torch_distributor, engines that run the same torch loop


@dataclass(frozen=True)
class Sizes:
    rows: int
    epochs: int
    repetitions: int


FULL = Sizes(rows=50_000, epochs=4, repetitions=3)
QUICK = Sizes(rows=3_000, epochs=2, repetitions=1)


@dataclass(frozen=True)
class PathRun:
    wall_seconds: float
    metrics: dict

    @property
    def around_the_loop(self) -> float:
        return self.wall_seconds - self.metrics["seconds"]


def run(work_dir: str, quick: bool, log=print) -> list[Row]:
    from distributed_training.engines.local_spark import local_spark_session
    from distributed_training.training.sample_data import write_sample_trips
    from distributed_training.training.staging import stage_training_data

    sizes = QUICK if quick else FULL
    work = Path(work_dir, "engines")
    spark_seconds, spark = seconds(lambda: local_spark_session(cores=PROCESSES, warehouse_dir=str(work / "warehouse")))
    try:
        table = write_sample_trips(spark, str(work / "sample_trips"), rows=sizes.rows, seed=3)
        staging_seconds, staged = seconds(
            lambda: stage_training_data(spark, table, str(work / "staging"), world_size=PROCESSES, seed=3))
        rows = [
            Row("engines", "local Spark session start", spark_seconds, None, "s", "every Spark-based engine pays it"),
            Row("engines", f"staging {staged.train_rows + staged.test_rows:,} rows (Spark -> parquet)", staging_seconds,
                None, "s", "every Spark-based engine pays it; torchrun reads what it wrote"),
        ]
        sides = {"torchrun": lambda: _torchrun(staged, work / "torchrun", sizes),
                 "torch_distributor": lambda: _torch_distributor(staged, work / "torch_distributor", sizes)}
        for engine in _present(TORCH_LOOP_ENGINES):
            sides[engine] = lambda engine=engine: _through_launcher(spark, engine, table, work / engine, sizes,
                                                                    staging_seconds)
        log(f"engines: {', '.join(sides)}; {sizes.repetitions} run(s) each, alternating")
        measured = alternate({name: _logged(name, side, log) for name, side in sides.items()}, sizes.repetitions)
        baseline = measured.pop("torchrun")
        for engine, runs in measured.items():
            rows += _compare(engine, runs, baseline)
        if _present(("spark_ml_connect",)):
            rows.append(_spark_ml(spark, table, work / "spark_ml_connect", sizes))
        else:
            rows.append(Row("engines", "spark_ml_connect", 0.0, None, "s", "skipped: engines/spark_ml_connect.py absent"))
        for engine in TORCH_LOOP_ENGINES:
            if engine not in sides:
                rows.append(Row("engines", engine, 0.0, None, "s", f"skipped: engines/{engine}.py absent"))
        return rows
    finally:
        spark.stop()


def _compare(engine: str, runs: list[PathRun], baseline: list[PathRun]) -> list[Row]:
    return [
        Row("engines", f"{engine}: steady-state throughput", median([run.metrics["samples_per_second"] for run in runs]),
            median([run.metrics["samples_per_second"] for run in baseline]), "samples/s",
            f"{PROCESSES} CPU processes, after the first epoch; baseline: torchrun"),
        Row("engines", f"{engine}: start-up and teardown around the loop", median([run.around_the_loop for run in runs]),
            median([run.around_the_loop for run in baseline]), "s",
            f"adds {median([run.around_the_loop for run in runs]) - median([run.around_the_loop for run in baseline]):.1f} s "
            "to torchrun's"),
    ]


def _logged(name, side, log):
    def run_and_log() -> PathRun:
        result = side()
        log(f"  {name}: {result.wall_seconds:.1f} s wall, loop {result.metrics['seconds']:.1f} s, "
            f"{result.metrics['samples_per_second']:,.0f} samples/s")
        return result

    return run_and_log


def _present(engines) -> list[str]:
    return [engine for engine in engines
            if importlib.util.find_spec(f"distributed_training.engines.{engine}") is not None]


def _torchrun(staged, output_dir: Path, sizes: Sizes) -> PathRun:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(PROCESSES),
               "-m", "distributed_training.training.train_staged", "--staging-dir", staged.directory,
               "--output-dir", str(output_dir), "--epochs", str(sizes.epochs)]
    wall, completed = seconds(lambda: subprocess.run(command, capture_output=True, text=True, env=environment))
    if completed.returncode != 0:
        raise RuntimeError(f"torchrun failed:\n{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}")
    return PathRun(wall, json.loads((output_dir / "metrics.json").read_text()))


def _torch_distributor(staged, output_dir: Path, sizes: Sizes) -> PathRun:
    from distributed_training.engines.torch_distributor import Placement, distribute
    from distributed_training.training.config import TrainingConfig

    config = TrainingConfig(data=staged, output_dir=str(output_dir), epochs=sizes.epochs)
    wall, metrics = seconds(lambda: distribute(config, Placement(PROCESSES, local_mode=True, use_gpu=False)))
    return PathRun(wall, metrics)


def _settings(engine: str, table: str, output_dir: Path, sizes: Sizes):
    """RunSettings as the `train` command would build them for `--local` on this table."""
    from distributed_training.engines import launch
    from distributed_training.engines.settings import settings_from_args

    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return settings_from_args(parser.parse_args([
        "--engine", engine, "--local", "--table", table, "--output-dir", str(output_dir),
        "--processes", str(PROCESSES), "--epochs", str(sizes.epochs), "--seed", "3"]))


def _through_launcher(spark, engine: str, table: str, output_dir: Path, sizes: Sizes, staging_seconds: float) -> PathRun:
    module = importlib.import_module(f"distributed_training.engines.{engine}")
    settings = _settings(engine, table, output_dir, sizes)
    wall, result = seconds(lambda: module.train(spark, settings))
    return PathRun(wall - staging_seconds, result.metrics)


def _spark_ml(spark, table: str, output_dir: Path, sizes: Sizes) -> Row:
    module = importlib.import_module("distributed_training.engines.spark_ml_connect")
    settings = _settings("spark_ml_connect", table, output_dir, sizes)
    wall, _ = seconds(lambda: module.train(spark, settings))
    return Row("engines", "spark_ml_connect: one training run, wall time", wall, None, "s",
               "Spark ML trains no torch loop: no throughput to compare")
