"""Engine overhead: each engine path against a plain `torchrun` of the same loop, same data, same model.

Every engine runs as a user runs it, `python -m distributed_training train --engine E --local --table T`, on the
same sample table. The baseline is torchrun of the very same run: `train --handoff-to-torchrun` stages the table and
writes the config the engine would give its processes (DDP, or DeepSpeed with the same DeepSpeed config), and the
command it writes runs `training.train_staged --config` under torchrun. Ray Train runs DDP: its baseline is the DDP
one. Two figures per engine, the throughput from the loop's own metrics.json:
- steady-state throughput: training samples per second over all ranks after the first epoch (ratio to torchrun);
- start-up and teardown: the wall time of the whole command less the loop's own time, against the same for
  torchrun. For the Spark engines this includes a Spark session and the staging, measured once on their own here
  and shown above them, so that the rest is what the distributor, the Ray cluster or DeepSpeed adds.
Spark ML (Connect) trains no torch loop and has only a wall time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .measure import Row, alternate, median, seconds

SOURCE = Path(__file__).resolve().parents[1] / "src"
PROCESSES = 2
TORCH_LOOP_ENGINES = ("torch_distributor", "deepspeed", "ray")  # engines that run the same torch loop
# The torchrun run each engine is compared with: the same strategy, the same config.
BASELINE_OF = {"torch_distributor": "DDP", "deepspeed": "DeepSpeed", "ray": "DDP"}
HANDOFF_ENGINE = {"DDP": "torch_distributor", "DeepSpeed": "deepspeed"}


@dataclass(frozen=True)
class Sizes:
    rows: int
    epochs: int
    repetitions: int


# Ten epochs: the figure is over epochs 2-10, past what is still settling when the loop starts (Ray's nodes keep
# the two cores busy for a few seconds after they come up).
FULL = Sizes(rows=30_000, epochs=10, repetitions=2)
QUICK = Sizes(rows=3_000, epochs=2, repetitions=1)


@dataclass(frozen=True)
class PathRun:
    wall_seconds: float
    metrics: dict

    @property
    def around_the_loop(self) -> float:
        return self.wall_seconds - self.metrics["seconds"]


def run(work_dir: str, quick: bool, log=lambda line: print(line, flush=True)) -> list[Row]:
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
    finally:
        spark.stop()  # each engine command starts the session it needs (Ray on Spark needs one of its own)
    rows = [
        Row("engines", "local Spark session start", spark_seconds, None, "s", "every Spark-based engine pays it"),
        Row("engines", f"staging {staged.train_rows + staged.test_rows:,} rows (Spark -> parquet)", staging_seconds,
            None, "s", "every Spark-based engine pays it; torchrun reads what it wrote"),
    ]
    engines = _present(TORCH_LOOP_ENGINES)
    sides = {}
    for strategy in dict.fromkeys(BASELINE_OF[engine] for engine in engines):
        command = _hand_off(strategy, table, work / f"torchrun-{strategy}", sizes)
        sides[_baseline_name(strategy)] = lambda command=command: _torchrun(command)
    for engine in engines:
        sides[engine] = lambda engine=engine: _train_command(engine, table, work / engine, sizes)
    log(f"engines: {', '.join(sides)}; {sizes.repetitions} run(s) each, alternating")
    measured = alternate({name: _logged(name, side, log) for name, side in sides.items()}, sizes.repetitions)
    for engine in engines:
        baseline = _baseline_name(BASELINE_OF[engine])
        rows += _compare(engine, measured[engine], measured[baseline], baseline, spark_seconds + staging_seconds)
    rows += [Row("engines", engine, 0.0, None, "s", f"skipped: engines/{engine}.py absent")
             for engine in TORCH_LOOP_ENGINES if engine not in engines]
    if _present(("spark_ml_connect",)):
        wall, _ = seconds(lambda: _command("spark_ml_connect", table, work / "spark_ml_connect", sizes))
        rows.append(Row("engines", "spark_ml_connect: one `train --local` run, wall time", wall, None, "s",
                        "Spark ML trains no torch loop: no throughput to compare"))
    else:
        rows.append(Row("engines", "spark_ml_connect", 0.0, None, "s", "skipped: engines/spark_ml_connect.py absent"))
    return rows


def _compare(engine: str, runs: list[PathRun], baseline: list[PathRun], baseline_name: str,
             spark_and_staging: float) -> list[Row]:
    around, around_baseline = median([run.around_the_loop for run in runs]), median([r.around_the_loop for r in baseline])
    return [
        Row("engines", f"{engine}: steady-state throughput", median([run.metrics["samples_per_second"] for run in runs]),
            median([run.metrics["samples_per_second"] for run in baseline]), "samples/s",
            f"{PROCESSES} CPU processes, after the first epoch; baseline: {baseline_name}"),
        Row("engines", f"{engine}: start-up and teardown around the loop", around, around_baseline, "s",
            f"adds {around - around_baseline:.1f} s to {baseline_name}'s, {spark_and_staging:.1f} s of it Spark "
            "start and staging"),
    ]


def _baseline_name(strategy: str) -> str:
    return f"torchrun ({strategy})"


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


def _environment() -> dict:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # command.sh's python
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}


def _run(command: list[str], what: str, log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as output:
        completed = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=_environment())
    if completed.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {completed.returncode}):\n{log_file.read_text()[-3000:]}")


def _hand_off(strategy: str, table: str, output_dir: Path, sizes: Sizes) -> Path:
    """Stage and plan the baseline's run (not timed); the torchrun command it wrote."""
    _command(HANDOFF_ENGINE[strategy], table, output_dir, sizes, "--handoff-to-torchrun")
    return output_dir / "torchrun" / "command.sh"


def _torchrun(command: Path) -> PathRun:
    output_dir = command.parent.parent
    wall, _ = seconds(lambda: _run(["bash", str(command)], "torchrun", output_dir.with_suffix(".log")))
    return PathRun(wall, json.loads((output_dir / "metrics.json").read_text()))


def _command(engine: str, table: str, output_dir: Path, sizes: Sizes, *options: str) -> None:
    command = [sys.executable, "-m", "distributed_training", "train", "--engine", engine, "--local", "--table", table,
               "--output-dir", str(output_dir), "--processes", str(PROCESSES), "--epochs", str(sizes.epochs),
               "--seed", "3", "--no-resume", "--no-tracking", *options]
    _run(command, f"train --engine {engine} {' '.join(options)}".strip(), output_dir.with_suffix(".log"))


def _train_command(engine: str, table: str, output_dir: Path, sizes: Sizes) -> PathRun:
    wall, _ = seconds(lambda: _command(engine, table, output_dir, sizes))
    return PathRun(wall, json.loads((output_dir / "metrics.json").read_text()))
