"""Engine overhead: each engine against a plain `torchrun` of the same loop, config and staged rows, on both tasks.

Every engine runs as a user runs it, `python -m distributed_training train --engine E --task T --local --table TABLE`,
on one sample table per task. The baseline is torchrun of the very same run: `train --handoff-to-torchrun` (here in
this process, on its one Spark session) stages the table and writes the config the engine would give its processes
(DDP, or DeepSpeed with the same ZeRO config), and the command.sh it writes runs the loop under torchrun. Ray Train
runs DDP: its baseline is TorchDistributor's. The sides alternate, every repetition starting with the next one.

Three figures an engine, each against torchrun's:
- steady-state throughput: tokens (causal_lm) or examples (fare_regression) per second over all ranks, from the
  loop's own per-epoch timings after the first epoch, so start-up is left out;
- time to first step: from the command's start to the loop's line that opens the first epoch (for the engines it
  includes their Spark session and staging, measured on their own above them; Ray forwards the line late);
- wall time of the whole command.
Each throughput row records what both sides trained (staged rows, examples, epochs, steps), which must be equal.
Spark ML (Connect) trains no torch loop and has only a wall time.

And, as a section of its own (`reports`), the cost of the loop's progress reports, on the language model under
torchrun (DDP), the same throughput figure against no reports but the epochs' (`--log-every-steps 0`): a report every
step without MLflow (an all-reduce, a sync and a line), and one every 10 steps with MLflow metrics (into a local file
store; an MLflow call's background work takes a share of the 2 cores the ranks train on, which a GPU node's many cores
do not miss); goal: a ratio of at least 0.98.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .measure import Row, alternate, seconds

SOURCE = Path(__file__).resolve().parents[1] / "src"
PROCESSES = 2
BATCH_SIZE = 64
SEED = 3
RUN_TIMEOUT_SECONDS = 900  # one command; Ray on Spark, the slowest, starts in about 90 s here
TORCH_LOOP_ENGINES = ("torch_distributor", "deepspeed", "ray")
ENGINES = (*TORCH_LOOP_ENGINES, "spark_ml_connect")
# The engine whose `--handoff-to-torchrun` run is an engine's baseline: the same strategy, the same config.
BASELINE_OF = {"torch_distributor": "torch_distributor", "deepspeed": "deepspeed", "ray": "torch_distributor"}
STRATEGY_OF = {"torch_distributor": "DDP", "deepspeed": "DeepSpeed ZeRO-2"}
# --log-every-steps, and whether MLflow records the reports: the loop's own cost of a report every step (an
# all-reduce and a line), and a report every 10 steps into MLflow too, each against none; 0 is the baseline.
REPORTING = ((1, False), (10, True), (0, True))
TASKS = {"causal_lm": "distributed_training.tasks.causal_lm",
         "fare_regression": "distributed_training.tasks.fare_regression"}


@dataclass(frozen=True)
class Sizes:
    rows: int  # of the sample table
    epochs: int  # the steady-state figure is over all but the first
    repetitions: int


# The language model is the headline (a transformer, tiny to fit two cores); the fare MLP's steps are a few
# milliseconds, mostly Python and gloo latency, and it runs fewer repetitions.
FULL = {"causal_lm": Sizes(rows=4000, epochs=3, repetitions=5), "fare_regression": Sizes(30_000, 3, 2)}
QUICK = {"causal_lm": Sizes(rows=2000, epochs=2, repetitions=1), "fare_regression": Sizes(3000, 2, 1)}


@dataclass(frozen=True)
class CommandRun:
    wall_seconds: float
    first_step_seconds: float | None  # None: the loop's opening line never reached this process's output
    metrics: dict
    staged_rows: int

    def throughput(self, task: str) -> float:
        """Tokens per second for the language model (each example is a block of context tokens), else examples, over
        the epochs after the first (the loop's own timings of each epoch: evaluations and checkpoints left out)."""
        steady = self.metrics["epochs"][1:] or self.metrics["epochs"]
        examples = sum(epoch["examples_per_second"] * epoch["train_seconds"] for epoch in steady)
        return examples / sum(epoch["train_seconds"] for epoch in steady) * tokens_per_example(task)

    @property
    def work(self) -> dict:
        """What the loop trained. Its steps per epoch are what its examples_per_second counts: steps x batch x
        world size examples in train_seconds."""
        epochs, world = self.metrics["epochs"], self.metrics["world_size"]
        steps = sum(round(epoch["examples_per_second"] * epoch["train_seconds"] / (BATCH_SIZE * world))
                    for epoch in epochs)
        return {"staged_train_rows": self.staged_rows, "train_examples": self.metrics["train_examples"],
                "world_size": world, "epochs": len(epochs), "steps_per_process": steps}


def tokens_per_example(task: str) -> int:
    if task != "causal_lm":
        return 1
    from distributed_training.tasks.causal_lm import PRESETS

    return PRESETS["tiny"][3]


def run(work_dir: str, quick: bool, engines: tuple[str, ...] = ENGINES, tasks: tuple[str, ...] = tuple(TASKS),
        log=lambda line: print(line, flush=True)) -> list[Row]:
    from distributed_training.engines.local_spark import local_spark_session

    sizes = QUICK if quick else FULL
    work = Path(work_dir, "engines")
    torch_engines = [engine for engine in TORCH_LOOP_ENGINES if engine in engines]
    spark_seconds, spark = seconds(lambda: local_spark_session(cores=PROCESSES, warehouse_dir=str(work / "warehouse")))
    rows = [Row("engines", "local Spark session start", "s", (spark_seconds,), note="every engine command pays it")]
    baselines: dict[tuple[str, str], Path] = {}
    tables: dict[str, str] = {}
    try:
        for task in tasks:
            tables[task] = _sample_table(spark, task, work / task / "table", sizes[task].rows)
            for baseline in dict.fromkeys(BASELINE_OF[engine] for engine in torch_engines):
                staging, baselines[task, baseline] = seconds(lambda: _hand_off(
                    spark, baseline, task, tables[task], work / task / f"torchrun-{baseline}", sizes[task]))
                rows.append(Row("engines", f"{task}: staging for torchrun ({STRATEGY_OF[baseline]})", "s", (staging,),
                                note="Spark -> parquet; every engine command stages the same way"))
    finally:
        spark.stop()  # each engine command starts the session it needs (Ray on Spark needs one of its own)

    for task in tasks:
        sides = {_baseline_name(baseline): lambda command=command: _torchrun(command, task)
                 for (of_task, baseline), command in baselines.items() if of_task == task}
        for engine in torch_engines:
            numbers = itertools.count(1)  # a fresh folder a run: nothing of one run is left for the next
            sides[engine] = lambda engine=engine, numbers=numbers: _train(
                engine, task, tables[task], work / task / engine / f"run-{next(numbers)}", sizes[task])
        log(f"engines, {task}: {', '.join(sides)}; {sizes[task].repetitions} run(s) each, alternating")
        measured = alternate({name: _logged(name, side, task, log) for name, side in sides.items()},
                             sizes[task].repetitions)
        for engine in torch_engines:
            rows += _compare(task, engine, measured[engine], measured[_baseline_name(BASELINE_OF[engine])])
    if "spark_ml_connect" in engines and "fare_regression" in tasks:
        output = work / "fare_regression" / "spark_ml_connect"
        wall, _ = _timed(_train_command("spark_ml_connect", "fare_regression", tables["fare_regression"], output,
                                        sizes["fare_regression"]), "fare_regression", output)
        rows.append(Row("engines", "fare_regression: spark_ml_connect wall time", "s", (wall,),
                        note="Spark ML trains no torch loop: no throughput to compare"))
    return rows


def _compare(task: str, engine: str, runs: list[CommandRun], baseline: list[CommandRun]) -> list[Row]:
    name = _baseline_name(BASELINE_OF[engine])
    unit = "tokens/s" if task == "causal_lm" else "examples/s"
    rows = [Row("engines", f"{task}: {engine} steady-state throughput", unit,
                tuple(run.throughput(task) for run in runs), tuple(run.throughput(task) for run in baseline),
                f"{PROCESSES} CPU processes, epochs after the first; baseline: {name}",
                {"ours": _same_work(runs, engine), "baseline": _same_work(baseline, name)})]
    if all(run.first_step_seconds is not None for run in runs + baseline):
        rows.append(Row("engines", f"{task}: {engine} time to first step", "s",
                        tuple(run.first_step_seconds for run in runs),
                        tuple(run.first_step_seconds for run in baseline),
                        f"ours includes its Spark session and staging; baseline: {name}"))
    rows.append(Row("engines", f"{task}: {engine} wall time", "s", tuple(run.wall_seconds for run in runs),
                    tuple(run.wall_seconds for run in baseline), f"the whole command; baseline: {name}"))
    return rows


def run_reports(work_dir: str, quick: bool, log=lambda line: print(line, flush=True)) -> list[Row]:
    """The `reports` section: torchrun commands of the language model that differ in their --log-every-steps alone."""
    from distributed_training.engines.local_spark import local_spark_session

    sizes = (QUICK if quick else FULL)["causal_lm"]
    work = Path(work_dir, "reports")
    spark = local_spark_session(cores=PROCESSES, warehouse_dir=str(work / "warehouse"))
    try:
        table = _sample_table(spark, "causal_lm", work / "table", sizes.rows)
        commands = {every: _hand_off(spark, "torch_distributor", "causal_lm", table, work / f"every-{every}", sizes,
                                     "--log-every-steps", str(every), tracking=tracking)
                    for every, tracking in REPORTING}
    finally:
        spark.stop()
    return _reporting_cost(commands, sizes.repetitions, log)


def _reporting_cost(commands: dict[int, Path], repetitions: int, log) -> list[Row]:
    log(f"engines, causal_lm: progress reports every {' / '.join(map(str, commands))} steps, {repetitions} run(s) "
        "each, alternating")
    measured = alternate({every: _logged(f"--log-every-steps {every}", lambda command=command: _torchrun(
        command, "causal_lm"), "causal_lm", log) for every, command in commands.items()}, repetitions)
    none = measured[0]
    return [Row("engines", f"causal_lm: progress report every {every} step(s) against none", "tokens/s",
                tuple(run.throughput("causal_lm") for run in measured[every]),
                tuple(run.throughput("causal_lm") for run in none),
                f"torchrun, DDP, {PROCESSES} CPU processes, "
                f"{'MLflow into a local file store' if tracking else 'no MLflow'}; goal: a ratio >= 0.98",
                {"ours": _same_work(measured[every], f"every {every}"), "baseline": _same_work(none, "none")})
            for every, tracking in REPORTING if every]


def _same_work(runs: list[CommandRun], side: str) -> dict:
    """The work of every run of a side, which must be the same each time (a figure of different work means
    nothing)."""
    works = {json.dumps(run.work, sort_keys=True) for run in runs}
    if len(works) > 1:
        raise RuntimeError(f"the runs of {side} trained different work: {sorted(works)}")
    return runs[0].work


def _baseline_name(baseline: str) -> str:
    return f"torchrun ({STRATEGY_OF[baseline]})"


def _logged(name, side, task, log):
    def run_and_log() -> CommandRun:
        result = side()
        first_step = "?" if result.first_step_seconds is None else f"{result.first_step_seconds:.1f}"
        log(f"  {name}: {result.wall_seconds:.1f} s wall, first step at {first_step} s, "
            f"{result.throughput(task):,.0f} {'tokens' if task == 'causal_lm' else 'examples'}/s")
        return result

    return run_and_log


def _sample_table(spark, task: str, path: Path, rows: int) -> str:
    from distributed_training.task_interface import load_task

    load_task(TASKS[task]).sample_table(spark, SEED, rows=rows).coalesce(1).write.mode("overwrite").parquet(str(path))
    return str(path)


def _options(engine: str, task: str, table: str, output_dir: Path, sizes: Sizes, tracking: bool = False) -> list[str]:
    return ["--engine", engine, "--task", TASKS[task], "--local", "--table", table, "--output-dir", str(output_dir),
            "--processes", str(PROCESSES), "--epochs", str(sizes.epochs), "--checkpoint-every", str(sizes.epochs),
            "--batch-size", str(BATCH_SIZE), "--seed", str(SEED), "--no-resume",
            *([] if tracking else ["--no-tracking"]), *(["--model-size", "tiny"] if task == "causal_lm" else [])]


def _hand_off(spark, engine: str, task: str, table: str, output_dir: Path, sizes: Sizes, *extra: str,
              tracking: bool = False) -> Path:
    """What `train --engine E --handoff-to-torchrun` does, on this process's Spark session: stage, write the config
    and the command; the command's path."""
    from distributed_training import config as configuration
    from distributed_training.engines import engine as engine_named
    from distributed_training.engines.torchrun import hand_off
    from distributed_training.launch import resolve

    config = configuration.from_args([*_options(engine, task, table, output_dir, sizes, tracking), *extra,
                                      "--handoff-to-torchrun"])
    configuration.check(config)
    hand_off(spark, resolve(config, engine_named(engine), spark), {})
    return output_dir / "torchrun" / "command.sh"


def _torchrun(command: Path, task: str) -> CommandRun:
    return _finished(_timed(["bash", str(command)], task, command.parent.parent), command.parent.parent)


def _train(engine: str, task: str, table: str, output_dir: Path, sizes: Sizes) -> CommandRun:
    return _finished(_timed(_train_command(engine, task, table, output_dir, sizes), task, output_dir), output_dir)


def _train_command(engine: str, task: str, table: str, output_dir: Path, sizes: Sizes) -> list[str]:
    return [sys.executable, "-m", "distributed_training", "train", *_options(engine, task, table, output_dir, sizes)]


def _finished(timings: tuple[float, float | None], output_dir: Path) -> CommandRun:
    metrics = json.loads((output_dir / "metrics.json").read_text())
    manifest = json.loads((output_dir / "staging" / "manifest.json").read_text())
    return CommandRun(*timings, metrics, manifest["train_rows"])


def _timed(command: list[str], task: str, output_dir: Path) -> tuple[float, float | None]:
    """Run the command, its output into OUTPUT_DIR.log; its wall time, and when the loop opened its first epoch (the
    line 'Training <task module> with ...'), in seconds from the start."""
    log_file = output_dir.with_suffix(".log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    first_step = None
    started = time.perf_counter()
    with open(log_file, "w") as output:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=_environment(), start_new_session=True)
        # Past the limit the whole process group goes: the distributor's, Spark's and Ray's processes with it.
        watchdog = threading.Timer(RUN_TIMEOUT_SECONDS, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        try:
            for line in process.stdout:
                if first_step is None and line.startswith("Training ") and task in line:
                    first_step = time.perf_counter() - started
                output.write(line)
            returncode = process.wait()
        except BaseException:  # an interrupted benchmark leaves nothing running (the group is not its own)
            os.killpg(process.pid, signal.SIGKILL)
            raise
        finally:
            watchdog.cancel()
    wall = time.perf_counter() - started
    if returncode != 0:
        raise RuntimeError(f"{' '.join(command[-20:])} failed (exit {returncode}, killed after "
                           f"{RUN_TIMEOUT_SECONDS} s if negative):\n{log_file.read_text()[-3000:]}")
    return wall, first_step


def _environment() -> dict:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # command.sh's
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}

