"""`train` refuses what it cannot use before Spark starts: numbers it cannot train with, options that cannot work
together, an output folder it cannot write or that another run holds. Each case: the exit code, the rule and the fix
in the message, no traceback, within seconds, nothing started. The matrix is counted so it cannot shrink quietly."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from distributed_training.launch import main
from distributed_training.run_folder import held

from support.runs import FARE

TRAIN = ["--engine", "torch_distributor", "--task", FARE]


@dataclass(frozen=True)
class Case:
    name: str
    options: tuple[str, ...]
    code: int
    words: tuple[str, ...]  # the rule and, where the rule alone does not say it, the fix


def usage(name, option, value, *words):
    return Case(name, ("--local", option, value), 2, (f"argument {option}", *words))


CASES = [
    usage("zero-epochs", "--epochs", "0", "outside 1..100000"),
    usage("epochs-in-exponent-notation", "--epochs", "1e9", "is not a whole number"),
    usage("a-word-for-a-count", "--batch-size", "x", "is not a whole number"),
    usage("infinite-learning-rate", "--learning-rate", "inf", "must be a finite number above 0"),
    usage("nan-learning-rate", "--learning-rate", "nan", "must be a finite number above 0"),
    usage("negative-learning-rate", "--learning-rate", "-0.1", "must be a finite number above 0"),
    usage("absurd-learning-rate", "--learning-rate", "1e300", "at most 10"),
    usage("negative-clipping", "--grad-clip", "-1", "at least 0"),
    usage("no-processes", "--processes", "0", "outside 1..1024"),
    usage("too-many-nodes", "--num-nodes", "257", "outside 1..256"),
    usage("an-empty-hidden-layer", "--hidden-sizes", "64,0", "outside 1..1000000"),
    usage("a-precision-that-does-not-exist", "--precision", "fp8", "invalid choice"),
    Case("local-on-several-nodes", ("--local", "--num-nodes", "2"), 2,
         ("--local runs on this machine, one node, but --num-nodes is 2",)),
    Case("local-with-gpus", ("--local", "--gpus-per-node", "4"), 2,
         ("--local trains on CPU processes, but --gpus-per-node is 4",)),
    Case("no-output-folder-on-a-cluster", (), 2, ("--output-dir is required on a cluster",)),
    Case("an-output-uri", ("--output-dir", "dbfs:/tmp/run"), 2,
         ("is a URI, but the training processes read the staged data as files",)),
    Case("processes-beside-gpus", ("--output-dir", "/Volumes/c/s/v/run", "--processes", "2", "--gpus-per-node", "4"),
         2, ("with GPUs there is one per GPU",)),
    Case("a-node-local-folder-for-several-nodes", ("--output-dir", "/tmp/run", "--num-nodes", "2",
                                                   "--gpus-per-node", "4"), 2,
         ("--output-dir /tmp/run is not shared between nodes",)),
    Case("a-handoff-without-gpus", ("--output-dir", "/Volumes/c/s/v/run", "--handoff-to-torchrun"), 2,
         ("--handoff-to-torchrun plans a run on nodes this task does not see: give --gpus-per-node", "or --processes")),
    Case("deepspeed-options-for-another-engine", ("--local", "--zero-stage", "3"), 2,
         ("--zero-stage configure DeepSpeed, but the engine is torch_distributor",)),
    Case("fsdp2-for-deepspeed", ("--local", "--engine", "deepspeed", "--parallelism", "fsdp2"), 2,
         ("--parallelism fsdp2 is for torch_distributor and ray, but the engine is deepspeed: use --engine "
          "torch_distributor",)),
    Case("spark-ml-options-for-another-engine", ("--local", "--spark-ml-model", "gbt"), 2,
         ("--spark-ml-model configure Spark ML",)),
    Case("registering-an-untracked-model", ("--local", "--register-model", "c.s.m", "--no-tracking"), 2,
         ("--no-tracking turns MLflow off",)),
    Case("an-unknown-task-module", ("--local", "--task", "nowhere.task"), 2, ("no task module 'nowhere.task'",)),
    Case("an-output-folder-under-a-file", ("--local", "--output-dir", "{tmp}/a-file/run"), 1,
         ("cannot write into --output-dir", "Give a folder this run can create and write")),
    Case("an-output-folder-another-run-holds", ("--local", "--output-dir", "{tmp}/held"), 1,
         ("is in use by another training run (pid", "give this run its own --output-dir")),
    Case("a-handoff-without-its-job-run", ("--output-dir", "/Volumes/c/s/v/run", "--handoff-to-torchrun",
                                           "--gpus-per-node", "8"), 2,
         ("no --job-run-id was given: pass --job-run-id {{job.run_id}}",)),
    Case("init-from-nothing", ("--local", "--init-from", "{tmp}/no-such-run"), 2,
         ("no-such-run does not exist: give an earlier run's output folder",)),
    Case("init-from-this-runs-own-folder", ("--local", "--output-dir", "{tmp}/a-file/..", "--init-from",
                                            "{tmp}/a-file"), 2,
         ("is inside this run's own --output-dir: a rerun into that folder resumes there by itself",)),
    Case("init-mode-without-init-from", ("--local", "--init-mode", "full"), 2,
         ("--init-mode full says what --init-from takes, but --init-from is not given",)),
    usage("an-unknown-init-mode", "--init-mode", "optimizer", "invalid choice: 'optimizer'"),
    Case("activation-checkpointing-without-blocks", ("--local", "--activation-checkpointing"), 2,
         (f"--activation-checkpointing recomputes the task's blocks, but {FARE} names none: define blocks(model)",)),
    Case("fp16-on-local-cpu", ("--local", "--precision", "fp16"), 2,
         ("--precision fp16 needs GPUs, but this run trains on CPU", "use fp32 (or bf16)")),
    Case("fp16-on-cpu-processes", ("--output-dir", "/Volumes/c/s/v/run", "--processes", "2", "--precision", "fp16"),
         2, ("--precision fp16 needs GPUs, but this run trains on CPU", "use fp32 (or bf16)")),
]
MIN_CASES = 32
# A hang's backstop, not the proof (no_spark_starts is): well under a second once imported; the first case of a
# process that loads the task imports torch (cold: 4 s at a load average of 4, 9 s at 7).
REFUSAL_BOUND_S = 60


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_train_refuses_it_before_anything_starts(case, tmp_path, monkeypatch, capsys, no_spark_starts):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    options = [option.replace("{tmp}", str(tmp_path)) for option in case.options]
    started = time.perf_counter()
    with held(str(tmp_path / "held")):  # another run, holding its folder for as long as it trains
        try:
            code = main([*TRAIN, *options])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    assert time.perf_counter() - started < REFUSAL_BOUND_S  # nothing was started: no_spark_starts says so
    captured = capsys.readouterr()
    assert code == case.code, captured.err
    assert captured.out == "" and "Traceback" not in captured.err
    assert all(words in captured.err for words in case.words), captured.err
    assert captured.err.rstrip().splitlines()[-1].count("error") == 1  # the last line is the one error
    assert not [path.name for path in tmp_path.iterdir() if path.name not in ("a-file", "held")]


def test_the_matrix_keeps_its_cases():
    assert len(CASES) >= MIN_CASES and len({case.name for case in CASES}) == len(CASES)
    assert {case.code for case in CASES} == {1, 2}
