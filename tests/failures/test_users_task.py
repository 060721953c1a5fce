"""`train` with a broken task file: the user's own code is where a run meets what this package did not write. A
task module that does not import, whose Options clash with train's own options, or that lacks a name of the seam is
refused before Spark starts (exit 2); one that breaks the seam's contract in training (examples of different
lengths, a summary without held_out_loss) fails before the first step (exit 1). Each case: one error line that
names the task's file and line or function and the fix, no traceback after it, nothing written. Each case's task
is the fare task with one thing broken. The matrix is counted so it cannot shrink quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from distributed_training.launch import main

from support.runs import LANGUAGE

SOURCE = Path(__file__).resolve().parents[2] / "src"
FARE_COPY = ("from dataclasses import dataclass\n"
             "from distributed_training.tasks import fare_regression as fare\n"
             "from distributed_training.tasks.fare_regression import *\n")
BROKEN_LINE = FARE_COPY.count("\n") + 1  # the first line of a case's own code
TRAINING_SECONDS = 300  # a Spark session, the sample table, staging and one training process, on a loaded machine


@dataclass(frozen=True)
class Case:
    name: str
    code: str  # what breaks the copy of the fare task, appended to it
    words: tuple[str, ...]  # in the error line, with {module}, {file} and {line} filled in
    trains: bool = False  # found only once training starts: through the command line, exit 1

    @property
    def module(self) -> str:
        return "users_task_" + self.name.replace("-", "_")  # one per case: a module imported once stays imported


def not_imported(name, code, *words):
    return Case(name, code, ("the task module {module} does not import: {file}, line {line}: ", *words,
                             "python -c 'import {module}' shows the whole traceback"))


def clashing(name, field_line, field):
    return Case(name, f"@dataclass(frozen=True)\nclass Options:\n    {field_line}\n",
                (f"{{module}}.Options has the field(s) {field}, which clash with train's own option(s)",
                 f"rename them in Options (e.g. {field} to task_{field})"))


CASES = [
    not_imported("a-syntax-error", "def broken(:\n    pass\n", "SyntaxError: "),
    not_imported("an-indentation-error", "    SCALE = 2\n", "IndentationError: unexpected indent"),
    not_imported("a-missing-dependency", "import fare_helpers_not_installed\n",
                 "ModuleNotFoundError: No module named 'fare_helpers_not_installed'"),
    not_imported("a-missing-name-in-a-module", "from math import no_such_function\n",
                 "ImportError: cannot import name 'no_such_function' from 'math'"),
    not_imported("an-error-at-import", "SCALE = {}['fare_scale']\n", "KeyError: 'fare_scale'"),
    not_imported("an-error-in-its-own-function", "def load(): raise RuntimeError('no weights in weights.pt')\n"
                 "WEIGHTS = load()\n", "RuntimeError: no weights in weights.pt"),
    not_imported("an-error-inside-a-library-it-calls", "import json; SETTINGS = json.loads('{')\n",
                 "JSONDecodeError: Expecting property name"),  # the task's own line, not the library's
    not_imported("an-error-of-several-lines", "raise ValueError('the first line\\nthe second line')\n",
                 "ValueError: the first line: fix it"),
    clashing("options-named-like-epochs", "epochs: int = 3", "epochs"),
    clashing("options-named-like-seed", "seed: int = 7", "seed"),
    clashing("options-with-a-switch-named-like-resume", "resume: bool = False", "resume"),  # no argparse clash
    Case("a-missing-name-of-the-seam", "del build_model\n",
         ("the task module {module} lacks build_model: a task defines DEFAULT_TABLE",)),
    Case("options-not-a-dataclass", "class Options:\n    pass\n",
         ("{module}.Options must be a dataclass",)),
    Case("examples-of-different-lengths", "def examples(rows, stats, options):\n"
         "    features, fares = fare.examples(rows, stats, options)\n"
         "    return features[:3], fares[:2]\n",
         ("{module}.examples returned tensors of 3 and 2 rows", "as many rows in each"), trains=True),
    Case("a-summary-without-held-out-loss", "def summarize(sums, stats):\n"
         "    return {name: value for name, value in fare.summarize(sums, stats).items() if name != 'held_out_loss'}\n",
         ("{module}.summarize returned no held_out_loss",), trains=True),
]
MIN_CASES = 15


def task_file(case: Case, folder: Path) -> Path:
    folder.mkdir()
    path = folder / f"{case.module}.py"
    path.write_text(FARE_COPY + case.code)
    return path


def expected(case: Case, path: Path) -> list[str]:
    return [words.format(module=case.module, file=path, line=BROKEN_LINE) for words in case.words]


def train_arguments(case: Case, output_dir: Path) -> list[str]:
    return ["--engine", "torch_distributor", "--task", case.module, "--local", "--output-dir", str(output_dir),
            "--epochs", "1", "--no-tracking"]


@pytest.mark.parametrize("case", [case for case in CASES if not case.trains], ids=lambda case: case.name)
def test_a_broken_task_is_refused_in_one_line_before_spark(case, tmp_path, monkeypatch, capsys, no_spark_starts):
    path = task_file(case, tmp_path / "src")
    monkeypatch.syspath_prepend(str(path.parent))
    code = main(train_arguments(case, tmp_path / "run"))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert all(words in lines[0] for words in expected(case, path)), lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.engine
@pytest.mark.parametrize("case", [case for case in CASES if case.trains], ids=lambda case: case.name)
def test_a_task_that_breaks_the_seam_in_training_fails_before_the_first_step(case, tmp_path):
    path = task_file(case, tmp_path / "src")
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(path.parent), str(SOURCE),
                                                               os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", *train_arguments(case, tmp_path / "run"),
         "--processes", "1"], cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=TRAINING_SECONDS)
    output = completed.stdout
    assert completed.returncode == 1, output[-3000:]
    lines = output.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [lines[-1]], output[-3000:]  # one error line, and no traceback after it
    assert all(words in errors[0] for words in expected(case, path)), errors[0]
    assert "training failed in the worker processes" in errors[0] and "Traceback" not in errors[0]
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert f"Training {case.module} with" not in output  # it failed before the first step


def test_help_lists_the_task_s_own_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--task", LANGUAGE, "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert all(option in shown for option in ("--engine", "--epochs", "--text-column", "--model-size")), shown


def test_the_matrix_keeps_its_cases():
    assert len(CASES) >= MIN_CASES and len({case.name for case in CASES}) == len(CASES)
    assert {case.trains for case in CASES} == {True, False}
