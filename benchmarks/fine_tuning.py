"""The fine-tuning task's loop against Hugging Face's `Trainer`, on one CPU process: tokens per second of the training
steps and the process's peak memory, with LoRA and in full.

Both sides train the same small model (fine_tune.save_small_model: a 2-layer Llama of width 64 and a BPE vocabulary of
512, random weights) in fp32 on the same token blocks: the sample table staged once by the real staging (local Spark,
the task's `prepare` and `tokenize`), read back as the loop reads it (`examples` of the staged shard). Each
measurement is a fresh process:
- ours: the loop's own pieces as `training.loop.train` runs them (its setup, `take_steps`, `finish`), so that its
  meter's figures are read directly: the tokens it counted and the seconds they took;
- Trainer (transformers): the task's `build_model` (the same LoRA adapters), the same blocks as `input_ids` and
  already shifted `shift_labels` (the loss on the same targets as ours, from the same number of positions), the same
  batch size, steps, peak learning rate, warm-up, cosine schedule, weight decay, betas and gradient clipping; its
  defaults otherwise (fused AdamW), no evaluation, no saving, one torch thread each
  (TORCH_THREADS).
Tokens per second are over the steps after the first WARM_UP_STEPS (the same steps on both sides: the data, forward,
backward and optimizer of each; our loop's evaluations and checkpoint are outside them, and the Trainer does
neither). Peak memory is the process's VmHWM (its peak resident set) after the last step, before our `finish` writes
the model: the imports, the model, the data and the steps. The sides alternate, every repetition starting with the
next one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from .measure import Row, alternate

FINE_TUNE = "distributed_training.tasks.fine_tune"
MODES = {"LoRA": 16, "full": 0}  # --lora-rank
MAX_LENGTH = 128
BATCH_SIZE = 16
WARM_UP_STEPS = 10  # left out of the figures on both sides (ours: its first progress report settles them)
SEED = 3
# Each side's torch threads. One: the 2 cores here are shared with other work, and two OpenMP threads that wait on each
# other at every operation then take 25 times as long (measured: a step of the LoRA model in 150 ms on one thread,
# 3.7 s on two at a load average of 8); either side would pay it alike, at random.
TORCH_THREADS = 1
RESULT = "result.json"
ROOT = Path(__file__).resolve().parents[1]


def run(work_dir: str, quick: bool) -> list[Row]:
    from distributed_training.engines.local_spark import local_spark_session

    steps, repetitions, table_rows = (WARM_UP_STEPS + 5, 1, 5_000) if quick else (WARM_UP_STEPS + 40, 5, 12_000)
    work = Path(work_dir, "fine_tuning")
    spark = local_spark_session(cores=2, warehouse_dir=str(work / "warehouse"))
    try:
        base_model, staging = _stage(spark, work, table_rows)
    finally:
        spark.stop()
    rows = []
    for mode, rank in MODES.items():
        configs = {side: _write_config(work / mode / side, staging, base_model, rank, steps) for side in SIDES}
        counters = {side: iter(range(1, 1_000)) for side in SIDES}
        measured = alternate({side: lambda side=side: _measure(side, configs[side], next(counters[side]))
                              for side in SIDES}, repetitions)
        for side, runs in measured.items():
            print(f"  {mode}, {side}: " + ", ".join(f"{run['tokens_per_second']:,.0f} tokens/s ({run['peak_mib']:.0f} "
                                                    "MiB)" for run in runs), flush=True)
        ours, trainer = measured["ours"], measured["Trainer"]
        work_done = {"ours": _same_work(ours, "ours"), "baseline": _same_work(trainer, "Trainer")}
        shape = f"1 CPU process, fp32, batch {BATCH_SIZE} x {MAX_LENGTH} tokens, steps {WARM_UP_STEPS + 1}-{steps}"
        rows += [Row("fine-tuning", f"fine_tune {mode}: the loop against transformers' Trainer", "tokens/s",
                     tuple(run["tokens_per_second"] for run in ours),
                     tuple(run["tokens_per_second"] for run in trainer),
                     f"{shape}; baseline: Trainer", work_done),
                 Row("fine-tuning", f"fine_tune {mode}: peak resident memory of the process", "MiB",
                     tuple(run["peak_mib"] for run in ours), tuple(run["peak_mib"] for run in trainer),
                     "VmHWM after the last step (imports, model, data, steps); baseline: Trainer", work_done)]
    return rows


def _stage(spark, work: Path, table_rows: int) -> tuple[str, str]:
    """The small model, and the task's sample table staged for one process by the real staging: (model, staging)."""
    from distributed_training.config import Config
    from distributed_training.data.staging import stage
    from distributed_training.task_interface import load_task
    from distributed_training.tasks import fine_tune

    rng = random.Random(SEED)
    base_model = str(work / "base-model")
    fine_tune.save_small_model(base_model, [fine_tune.sentence(rng) for _ in range(2_000)], seed=SEED)
    task = load_task(FINE_TUNE)
    table = str(work / "table")
    task.sample_table(spark, SEED, rows=table_rows).coalesce(1).write.mode("overwrite").parquet(table)
    config = Config(engine="torch_distributor", task=FINE_TUNE, local=True, table=table,
                    output_dir=str(work / "staged"), gpus_per_node=0, processes=1, precision="fp32",
                    tracking=False, batch_size=BATCH_SIZE, seed=SEED,
                    task_options=fine_tune.Options(base_model=base_model, max_length=MAX_LENGTH))
    return base_model, stage(spark, task, config, 1).directory


def _write_config(side_dir: Path, staging: str, base_model: str, lora_rank: int, steps: int) -> Path:
    from distributed_training.config import Config, to_json
    from distributed_training.tasks import fine_tune

    config = Config(engine="torch_distributor", task=FINE_TUNE, local=True, table="staged",
                    output_dir=str(side_dir), gpus_per_node=0, processes=1, precision="fp32", tracking=False,
                    epochs=1, max_steps=steps, batch_size=BATCH_SIZE, seed=SEED, log_every_steps=WARM_UP_STEPS,
                    resume=False, keep_checkpoints=1,
                    task_options=fine_tune.Options(base_model=base_model, max_length=MAX_LENGTH, lora_rank=lora_rank))
    side_dir.mkdir(parents=True, exist_ok=True)
    path = side_dir / "config.json"
    path.write_text(json.dumps({**to_json(config), "staging": staging}, indent=2))
    return path


def _measure(side: str, config: Path, number: int) -> dict:
    """One run of a side in a fresh process: its figures."""
    run_dir = config.with_name(f"run-{number}")
    command = [sys.executable, "-m", "benchmarks.fine_tuning", side, str(config), str(run_dir)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1_200)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {completed.returncode}):\n"
                           f"{completed.stdout[-2000:]}{completed.stderr[-3000:]}")
    return json.loads((run_dir / RESULT).read_text())


def _same_work(runs: list[dict], side: str) -> dict:
    works = {json.dumps(run["work"], sort_keys=True) for run in runs}
    if len(works) > 1:
        raise RuntimeError(f"the runs of {side} trained different work: {sorted(works)}")
    return runs[0]["work"]


# ------------------------------------------------------------------ one side, in its own process

def ours(config, _) -> dict:
    """The loop as `train` runs it, its meter read after the steps."""
    import torch

    from distributed_training.training import ranks
    from distributed_training.training.loop import Training

    process = ranks.start(use_gpu=False)
    torch.set_num_threads(TORCH_THREADS)  # in place of ranks.start's: all the cores
    try:
        training = Training(config, process, {})
        training.take_steps()
        peak = peak_mib()
        measured = training.meter.settlements[1:]  # the first settles the warm-up steps (the first report)
        training.finish()
        training.tracker.finish(succeeded=True)
    finally:
        ranks.stop(process)
    return {"tokens": round(sum(part["items"] for part in measured)),
            "seconds": sum(part["seconds"] for part in measured), "steps": sum(part["updates"] for part in measured),
            "peak_mib": peak}


def trainer(config, staging: str) -> dict:
    """transformers' Trainer on the same blocks, model, batch, steps and optimizer settings."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from distributed_training.data.staged import StagedData
    from distributed_training.task_interface import load_task
    from distributed_training.tasks.fine_tune import IGNORED, inputs_and_targets

    torch.set_num_threads(TORCH_THREADS)
    task, options = load_task(config.task), config.task_options
    data = StagedData.load(staging)
    (blocks,) = task.examples(data.shard("train", 0, 1), data.stats, options)
    torch.manual_seed(config.seed)
    model = task.build_model(data.stats, options)
    counted: list[int] = []  # the targets of each batch the data loader made, in order

    def collate(indices: list[int]) -> dict:
        inputs, targets = inputs_and_targets((blocks[torch.tensor(indices)],))
        counted.append(int((targets != IGNORED).sum()))
        return {"input_ids": inputs, "labels": targets, "shift_labels": targets}  # shifted already: no shift

    class StepClock(TrainerCallback):
        started = ended = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == WARM_UP_STEPS:
                self.started = time.perf_counter()
            elif state.global_step == config.max_steps:
                self.ended = time.perf_counter()

    clock = StepClock()
    arguments = TrainingArguments(
        output_dir=os.path.join(config.output_dir, "trainer"), use_cpu=True, seed=config.seed,
        per_device_train_batch_size=config.batch_size, max_steps=config.max_steps,
        learning_rate=config.learning_rate, weight_decay=config.weight_decay, adam_beta1=config.adam_betas[0],
        adam_beta2=config.adam_betas[1], warmup_steps=int(config.max_steps * config.warmup_fraction),
        lr_scheduler_type="cosine", max_grad_norm=config.grad_clip, logging_steps=WARM_UP_STEPS,
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, remove_unused_columns=False,
        dataloader_drop_last=True)
    Trainer(model=model, args=arguments, train_dataset=range(len(blocks)), data_collator=collate,
            callbacks=[clock]).train()
    peak = peak_mib()
    return {"tokens": sum(counted[WARM_UP_STEPS:config.max_steps]), "seconds": clock.ended - clock.started,
            "steps": config.max_steps - WARM_UP_STEPS, "peak_mib": peak}


SIDES = {"ours": ours, "Trainer": trainer}


def peak_mib() -> float:
    """This process's peak resident set (VmHWM), MiB."""
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return kib / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fine_tuning", description="one side's run")
    parser.add_argument("side", choices=list(SIDES))
    parser.add_argument("config", help="the config.json run() wrote")
    parser.add_argument("run_dir", help=f"a new folder: the run's output, and its figures ({RESULT})")
    args = parser.parse_args(argv)

    from distributed_training.config import from_json

    content = json.loads(Path(args.config).read_text())
    staging = content.pop("staging")
    config = dataclasses.replace(from_json(content, args.config), output_dir=args.run_dir)
    os.makedirs(config.output_dir)  # a fresh folder a run: nothing of one is left for the next
    os.symlink(staging, config.staging_dir)
    figures = SIDES[args.side](config, staging)
    Path(args.run_dir, RESULT).write_text(json.dumps({
        "tokens_per_second": figures["tokens"] / figures["seconds"], "peak_mib": figures["peak_mib"],
        "work": {"tokens": figures["tokens"], "steps": figures["steps"], "batch_size": config.batch_size,
                 "max_length": config.task_options.max_length, "lora_rank": config.task_options.lora_rank}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
