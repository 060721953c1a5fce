"""`score` with what cannot be scored: a folder without a finished run, a run of another task, a run without its
model or with one that does not load, a task without the scoring functions, an MLflow model that is not there,
held-out rows of another table, an output that is a file (exit 2, before Spark starts); a table
without the task's columns, held-out rows of a table changed since the run (exit 1, before any Spark job). Each
case: one error line that names the problem and the fix, and no output written. The run folders are made by hand, as
a finished run leaves them (no training needed to refuse them). The matrix is counted so it cannot shrink quietly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distributed_training import scoring
from distributed_training.data.staged import StagedData
from distributed_training.task_interface import load_task

from support.runs import FARE, LANGUAGE

NO_SCORE_TASK = "task_without_score"


def finished_run(folder: Path, task: str = FARE, model: bool = True) -> Path:
    """What a finished torch run leaves that `score` reads: metrics.json, the staged manifest, model.pt."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"engine": "torch_distributor", "task": task}))
    module = load_task(FARE if task == NO_SCORE_TASK else task)
    options = module.Options()
    StagedData(directory=str(folder / "staging"), task=task, source=str(folder.parent / "text"), train_rows=8,
               test_rows=2, files_per_split=2, stats={},
               recipe={"task_options": vars(options), "seed": 42, "fingerprint": {"of": "1 file(s), 0 bytes"}}).save()
    if model:
        torch.save(module.build_model({}, options).state_dict(), folder / "model.pt")
    return folder


CASES = {
    "no-run-there": (lambda root: root / "nothing", [], 2,
                     ("holds no finished training run (metrics.json", "give the output folder of a run that finished")),
    "another-task": (lambda root: finished_run(root / "run", task=LANGUAGE), [], 2,
                     (f"trained the task {LANGUAGE}, not {FARE}", f"(or --task {LANGUAGE})")),
    "no-model-file": (lambda root: finished_run(root / "run", model=False), [], 2,
                      ("has no model.pt", "train a new run (another --output-dir)")),
    "task-without-score": (lambda root: finished_run(root / "run", task=NO_SCORE_TASK), ["--task", NO_SCORE_TASK], 2,
                           (f"the task module {NO_SCORE_TASK} lacks SCORES, score", "see task_interface.py")),
    "table-without-the-columns": (lambda root: finished_run(root / "run"), ["--table", "TEXT_TABLE"], 1,
                                  ("the column(s) tpep_pickup_datetime (missing)",
                                   f"pass --table with a table shaped like {load_task(FARE).DEFAULT_TABLE}")),
    "held-out-of-another-table": (lambda root: finished_run(root / "run"), ["--rows", "held-out", "--table", "x.y.z"],
                                  2, ("--rows held-out scores the rows the run held out of its own table",
                                      "drop one of them")),
    "unknown-mlflow-model": (lambda root: "models:/no_such_model/1", [], 2,
                             ("--model models:/no_such_model/1: its run's folder is unknown", "not found",
                              "give a model version that exists where MLFLOW_TRACKING_URI points")),
    "held-out-of-a-changed-table": (lambda root: finished_run(root / "run"), ["--rows", "held-out"], 1,
                                    ("changed since the run staged it (1 file(s), 0 bytes then)",
                                     "score --rows all")),
    "output-is-a-users-file": (lambda root: users_file(root / "scores") and finished_run(root / "run"), [], 2,
                               ("scores is a file, where score writes a folder: name a new path",)),
    "model-cut-short": (lambda root: damaged_model(finished_run(root / "run"), cut=True), [], 2,
                        ("run/model.pt does not load (", "it is damaged, or not a model of", "train the run again")),
    "model-of-another-task": (lambda root: damaged_model(finished_run(root / "run"), cut=False), [], 2,
                              ("run/model.pt does not load (RuntimeError: Error(s) in loading state_dict",
                               "train the run again")),
}


def damaged_model(run: Path, cut: bool) -> Path:
    """The run's model.pt cut short (a copy stopped half way), or the weights of another task's model."""
    import torch

    model = run / "model.pt"
    if cut:
        model.write_bytes(model.read_bytes()[:model.stat().st_size // 2])
    else:
        language = load_task(LANGUAGE)
        torch.save(language.build_model({}, language.Options()).state_dict(), model)
    return run


def users_file(path: Path) -> Path:
    """A file of the user's where the scores would go: it must stay as it is, not be renamed aside."""
    path.write_text("the user's own notes")
    return path


def test_the_matrix_covers_every_refusal():
    assert len(CASES) == 11


@pytest.mark.parametrize("name", CASES)
def test_score_refuses_with_one_line_and_writes_nothing(name, tmp_path, spark, monkeypatch, capsys):
    make_run, options, code, words = CASES[name]
    (tmp_path / f"{NO_SCORE_TASK}.py").write_text("from distributed_training.tasks.fare_regression import *\n"
                                                  "del SCORES, score\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))  # a model registry with no models
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setattr(scoring, "_session", lambda scoring, local: spark)  # the test session's, left running
    monkeypatch.setattr(spark, "stop", lambda: None)
    text_table = tmp_path / "text"
    load_task(LANGUAGE).sample_table(spark, 0).limit(20).write.parquet(str(text_table))
    run = make_run(tmp_path)
    options = [str(text_table) if option == "TEXT_TABLE" else option for option in options]
    output = tmp_path / "scores"
    before = {path: path.read_bytes() for path in tmp_path.glob("scores*")}

    task = [] if "--task" in options else ["--task", FARE]
    assert scoring.main(["--model", str(run), *task, *options, "--output-table", str(output), "--local"]) == code
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    assert all(word in error for word in words), error
    assert {path: path.read_bytes() for path in tmp_path.glob("scores*")} == before, "nothing written or moved"
    sys.modules.pop(NO_SCORE_TASK, None)
