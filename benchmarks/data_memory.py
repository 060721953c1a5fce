"""A rank's own memory against the corpus: the language task on two corpus sizes, under torchrun as the hand-off path
runs it (`python -m distributed_training.engines.torchrun --config ...`: no JVM in the process tree), each rank's peak
RssAnon (its anonymous memory: the page cache of its memory-mapped tokens is the kernel's, not the rank's) sampled
from /proc while it trains.

Two rows:
1. data_memory: the peak RssAnon of a rank on the larger corpus against the smaller one, and its growth as a share
   of the corpus's growth (goal: under 10%). The same two corpora with the tokens copied into the rank's memory as
   int64 blocks, as the loop held them before they were memory-mapped, are in the note, for scale.
2. The throughput of the memory-mapped tokens against that in-memory copy, on the larger corpus, runs alternated.

Run alone: `bash benchmarks/run.sh --only memory` (`--quick` for 1 and 8 MB of text instead of 8 and 64 MB).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from .measure import Row

PROCESSES = 2
MAX_STEPS = 60  # enough to reach the steady state; the memory that grows with the corpus is taken before step 1
BATCH_SIZE = 32
TEST_DOCUMENTS = 2_000
SIDES = ("mapped", "in memory")
SOURCE = Path(__file__).resolve().parents[1] / "src"


def run(work_dir: str, quick: bool) -> list[Row]:
    sizes_mb = (1, 8) if quick else (8, 64)
    repetitions = 1 if quick else 3
    work = Path(work_dir) / "data_memory"
    staged = {size: _stage(work / f"staging-{size}mb", size) for size in sizes_mb}
    runs = {(size, side): [] for size in sizes_mb for side in SIDES}
    for repetition in range(repetitions):  # the sides and sizes alternate: what else runs disturbs them alike
        for size in sizes_mb:
            for side in SIDES:
                result = _train(work / f"{side.replace(' ', '-')}-{size}mb", staged[size], side)
                runs[size, side].append(result)
                print(f"  {size} MB of text, tokens {side}: peak RssAnon {result['peak_mib']:.0f} MiB a rank, "
                      f"{result['tokens_per_second']:,.0f} tokens/s", flush=True)
    peak = {key: statistics.median(result["peak_mib"] for result in results) for key, results in runs.items()}
    small, large = sizes_mb
    growth = peak[large, "mapped"] - peak[small, "mapped"]
    in_memory_growth = peak[large, "in memory"] - peak[small, "in memory"]
    corpus_growth = (staged[large]["text_bytes"] - staged[small]["text_bytes"]) / 2 ** 20
    setting = (f"torchrun, {PROCESSES} CPU processes, the tiny model, {MAX_STEPS} steps, {repetitions} run(s) a side "
               "alternated; a run's figure is the larger of its ranks' peaks")
    return [
        Row("memory", f"data_memory: a rank's peak RssAnon, {large} MB of text against {small} MB (tokens "
                      "memory-mapped)", "MiB", tuple(result["peak_mib"] for result in runs[large, "mapped"]),
            tuple(result["peak_mib"] for result in runs[small, "mapped"]),
            f"changes by {growth:+.1f} MiB for {corpus_growth:.0f} MiB more text: {growth / corpus_growth:+.1%} of the "
            f"corpus's growth (goal under 10%); with the tokens in memory as int64 blocks it grows "
            f"{in_memory_growth:.0f} MiB ({in_memory_growth / corpus_growth:.0%}); {setting}",
            {"corpus_mib": {size: staged[size]["text_bytes"] / 2 ** 20 for size in sizes_mb},
             "growth_share": growth / corpus_growth, "in_memory_growth_share": in_memory_growth / corpus_growth}),
        Row("memory", f"data_memory: throughput with the tokens memory-mapped, {large} MB of text", "tokens/s",
            tuple(result["tokens_per_second"] for result in runs[large, "mapped"]),
            tuple(result["tokens_per_second"] for result in runs[large, "in memory"]),
            f"baseline: the same run with the rank's tokens copied into its memory as int64 blocks; {setting}")]


def _stage(directory: Path, megabytes: int) -> dict:
    """About `megabytes` of TPC-H comments (a pool of distinct ones, repeated), staged as the language task's tokens
    for PROCESSES processes, without Spark."""
    from .synthetic import documents, stage_text

    pool = documents(20_000)
    average = sum(len(text) + 1 for text in pool) / len(pool)
    train = [pool[index % len(pool)] for index in range(int(megabytes * 2 ** 20 / average))]
    stage_text(str(directory), train, documents(TEST_DOCUMENTS, seed=1), files=PROCESSES)
    return {"directory": directory, "text_bytes": sum(len(text) for text in train)}


def _train(run_dir: Path, staged: dict, side: str) -> dict:
    """One run of the loop under torchrun; its tokens/s and the largest peak RssAnon of its ranks, in MiB."""
    import shutil

    from distributed_training.config import Config, to_json
    from distributed_training.tasks.causal_lm import Options

    from distributed_training.data.staged import local_cache

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    # Every run copies its tokens to the local disk, as a first attempt does: the copy's memory is part of the peak
    shutil.rmtree(local_cache(str(run_dir / "staging")), ignore_errors=True)
    (run_dir / "staging").symlink_to(Path(staged["directory"]).resolve())
    config = Config(engine="torch_distributor", task="distributed_training.tasks.causal_lm", local=True,
                    table="synthetic", output_dir=str(run_dir), gpus_per_node=0, processes=PROCESSES,
                    precision="fp32", epochs=1, max_steps=MAX_STEPS, batch_size=BATCH_SIZE, log_every_steps=0,
                    resume=False, tracking=False, task_options=Options(model_size="tiny"))
    (run_dir / "config.json").write_text(json.dumps(to_json(config)))
    if side == "mapped":
        command = [sys.executable, "-m", "distributed_training.engines.torchrun", "--config",
                   str(run_dir / "config.json")]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(PROCESSES),
                   "-m", "benchmarks.data_memory", "--config", str(run_dir / "config.json")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SOURCE), str(SOURCE.parent)])}
    with open(run_dir.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                   start_new_session=True)
        peaks = _sample_rss_anon(process)
    shutil.rmtree(local_cache(str(run_dir / "staging")), ignore_errors=True)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run_dir.with_suffix('.log').read_text()[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"tokens_per_second": metrics["tokens_per_second"], "peak_mib": max(peaks.values()) / 1024}


def _sample_rss_anon(process: subprocess.Popen, interval: float = 0.02) -> dict[int, int]:
    """Until the process ends: the peak RssAnon (KiB) of each rank in its session (the processes running the loop:
    not the launcher, not torchrun's agent)."""
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid in _ranks(process.pid):
                try:
                    with open(f"/proc/{pid}/status") as status:
                        anon = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
                except (OSError, StopIteration):
                    continue
                peaks[pid] = max(peaks.get(pid, 0), anon)
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        process.wait(timeout=900)
    finally:
        done.set()
        sampler.join()
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    if len(peaks) != PROCESSES:
        raise RuntimeError(f"sampled {len(peaks)} rank process(es), not {PROCESSES}")
    return peaks


def _ranks(root: int) -> list[int]:
    """The processes under `root` that run the loop (torchrun starts its workers in sessions of their own)."""
    parents, arguments = {}, {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as stat:
                parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                arguments[int(name)] = cmdline.read().split(b"\0")
        except OSError:
            continue

    def under_root(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == root:
                return True
        return False

    return [pid for pid, args in arguments.items() if under_root(pid) and b"torch.distributed.run" not in args
            and (b"--worker" in args or b"benchmarks.data_memory" in args)]


def _in_memory_worker(argv: list[str]) -> None:
    """A rank of the baseline: the loop as it is, but with its tokens copied into its memory as int64 (the loop's
    blocks before they were memory-mapped)."""
    import argparse

    import numpy as np

    from distributed_training.config import from_json
    from distributed_training.data.staged import StagedData
    from distributed_training.training import ranks
    from distributed_training.training.loop import train

    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    path = parser.parse_args(argv).config
    mapped = StagedData.shard
    StagedData.shard = lambda self, *args, **kwargs: np.array(mapped(self, *args, **kwargs), dtype=np.int64)
    with open(path) as file:
        train(from_json(json.load(file), path))
    ranks.leave_now()


if __name__ == "__main__":
    _in_memory_worker(sys.argv[1:])
