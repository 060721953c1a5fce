"""`train --table PATH` on data that cannot be trained on: text that is not UTF-8, files that are not parquet, a
folder with nothing in it, a column of the wrong type. Each case goes through the entry point and ends in one error
line that names the table, the column or file, and the fix: exit 1, no traceback, nothing of Py4J, nothing written.
Files the product wrote and something damaged afterwards: a staged file is one line naming it and the fix, a rank's
node-local copy of its tokens is made again.

In process, on the shared Spark session (the run's local session is that one, left running); through the command
line for the cases that used to end in a Java or pyarrow stack. The matrix is counted so it cannot shrink quietly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_training import launch

from support.runs import FARE, LANGUAGE

SOURCE = Path(__file__).resolve().parents[2] / "src"
BOUND_S = 300  # a hang's backstop on a loaded machine: each case fails at the read, before any training process


def invalid_utf8_text(path: Path) -> None:
    texts = [b"slyly regular deposits haggle."] * 50 + [b"bad \xff\xfe bytes"] * 3
    pq.write_table(pa.table({"o_orderkey": pa.array(range(len(texts)), pa.int64()),
                             "o_comment": pa.array(texts, pa.binary()).view(pa.string())}), path / "part-0.parquet")


def text_that_is_a_number(path: Path) -> None:
    pq.write_table(pa.table({"o_comment": pa.array(range(50), pa.int64())}), path / "part-0.parquet")


def random_bytes(path: Path) -> None:
    (path / "part-0.parquet").write_bytes(os.urandom(1000))


def csv_files(path: Path) -> None:
    for name in ("a.csv", "b.csv"):
        (path / name).write_text("trip_distance,fare_amount\n1.5,8.0\n")


def nothing(path: Path) -> None:
    pass


TRIPS = pa.schema([("tpep_pickup_datetime", pa.timestamp("us")), ("tpep_dropoff_datetime", pa.timestamp("us")),
                   ("trip_distance", pa.float64()), ("fare_amount", pa.float64())])


def no_rows(path: Path) -> None:
    pq.write_table(TRIPS.empty_table(), path / "part-0.parquet")


def a_distance_in_words(path: Path) -> None:
    rows = 50
    pq.write_table(pa.table({"tpep_pickup_datetime": pa.array([1_451_642_400_000_000] * rows, pa.timestamp("us")),
                             "tpep_dropoff_datetime": pa.array([1_451_643_000_000_000] * rows, pa.timestamp("us")),
                             "trip_distance": ["two miles"] * rows, "fare_amount": [9.5] * rows}),
                   path / "part-0.parquet")


@dataclass(frozen=True)
class Case:
    name: str
    task: str
    make: object  # writes the table's files into its folder
    words: tuple[str, ...]  # in the error line, besides the table's path


CASES = [
    Case("invalid-utf8-text", LANGUAGE, invalid_utf8_text,
         ("the column 'o_comment' holds 3 value(s) that are not valid UTF-8", "--text-column")),
    Case("text-that-is-a-number", LANGUAGE, text_that_is_a_number,
         ("has no string column 'o_comment'", "Pass --text-column with one of its string columns")),
    Case("not-parquet-file", FARE, random_bytes,
         ("cannot read the parquet path", "part-0.parquet is not a Parquet file", "Pass --table with")),
    Case("not-parquet-folder-of-csvs", FARE, csv_files,
         ("cannot read the parquet path", ".csv is not a Parquet file", "Pass --table with")),
    Case("an-empty-folder", FARE, nothing, ("cannot read the parquet path", "Unable to infer schema", "Pass --table")),
    Case("a-parquet-without-rows", FARE, no_rows, ("leaves 0 training row(s)", "train on a larger table")),
    Case("a-distance-in-words", FARE, a_distance_in_words,
         ("which the column(s) trip_distance (string) are not", "Cast them, or pass --table")),
]
MIN_CASES = 7


def table_for(case: Case, tmp_path: Path) -> Path:
    table = tmp_path / f"table-{case.name}"
    table.mkdir()
    case.make(table)
    return table


def arguments(case: Case, table: Path, output_dir: Path) -> list[str]:
    return ["--engine", "torch_distributor", "--task", case.task, "--local", "--table", str(table),
            "--output-dir", str(output_dir), "--epochs", "1", "--no-tracking"]


def assert_one_error_and_nothing_written(case: Case, code: int, err: str, table: Path, output_dir: Path) -> None:
    assert code == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert str(table) in errors[0] and all(words in errors[0] for words in case.words), errors[0]
    assert "Traceback" not in err and "py4j" not in err.lower(), err[-3000:]
    assert not (output_dir / "metrics.json").exists() and not (output_dir / "staging").exists()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_broken_data_ends_in_one_line_naming_it(case, tmp_path, capfd, run_on_the_shared_session):
    table, output_dir = table_for(case, tmp_path), tmp_path / "run"
    started = time.perf_counter()
    code = launch.main(arguments(case, table, output_dir))
    assert time.perf_counter() - started < BOUND_S
    assert_one_error_and_nothing_written(case, code, capfd.readouterr().err, table, output_dir)


@pytest.mark.engine
@pytest.mark.parametrize("case", [case for case in CASES if case.name in ("invalid-utf8-text",
                                                                           "not-parquet-folder-of-csvs")],
                         ids=lambda case: case.name)
def test_the_command_reports_broken_data_in_one_line(case, tmp_path):
    table, output_dir = table_for(case, tmp_path), tmp_path / "run"
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run([sys.executable, "-m", "distributed_training", "train",
                                *arguments(case, table, output_dir)],
                               capture_output=True, text=True, env=environment, timeout=BOUND_S)
    assert_one_error_and_nothing_written(case, completed.returncode, completed.stderr, table, output_dir)


def test_the_matrix_keeps_its_cases():
    assert len(CASES) >= MIN_CASES and len({case.name for case in CASES}) == len(CASES)


# Files the product wrote, damaged afterwards (a copy stopped half way, a disk that lost a block). A staged file is
# named with what is wrong and the fix; a node-local copy of the tokens, which the product made itself, is made again.


@pytest.fixture(scope="module")
def staged_runs(spark, tmp_path_factory):
    """A fare run and a language run staged for 2 processes, each case working on a copy of them."""
    from support.runs import resolved_config, staged

    folder = tmp_path_factory.mktemp("damaged")
    return {task: staged(spark, resolved_config(folder / task.rsplit(".", 1)[-1], task), world_size=2, rows=600)[1]
            for task in (FARE, LANGUAGE)}


def cut_short(path: str) -> None:
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def zeroed(path: str) -> None:
    with open(path, "r+b") as file:
        file.write(bytes(os.path.getsize(path)))


@dataclass(frozen=True)
class DamagedStagedFile:
    name: str
    task: str
    split: str
    damage: object  # what happens to rank 1's file of the split


DAMAGED_STAGED_FILES = [
    DamagedStagedFile("rows-cut-short", FARE, "train", cut_short),
    DamagedStagedFile("held-out-rows-cut-short", FARE, "test", cut_short),
    DamagedStagedFile("rows-overwritten-with-zeros", FARE, "train", zeroed),
    DamagedStagedFile("tokens-cut-short", LANGUAGE, "train", cut_short),
    DamagedStagedFile("held-out-tokens-overwritten-with-zeros", LANGUAGE, "test", zeroed),
]


def copy_of(staged_runs, task: str, folder: Path):
    from distributed_training.data.staged import StagedData

    shutil.copytree(staged_runs[task].directory, folder)
    return StagedData.load(str(folder))


@pytest.mark.parametrize("case", DAMAGED_STAGED_FILES, ids=lambda case: case.name)
def test_a_damaged_staged_file_is_named_with_the_fix(case, staged_runs, tmp_path):
    from distributed_training.data.staged import parquet_files

    data = copy_of(staged_runs, case.task, tmp_path / "staging")
    damaged = parquet_files(os.path.join(data.directory, case.split))[1]
    case.damage(damaged)
    data.shard(case.split, 0, 2, require_rows=case.split == "train")  # rank 0's share is whole
    with pytest.raises(ValueError) as error:
        data.shard(case.split, 1, 2, require_rows=case.split == "train")
    message = str(error.value)
    assert message.startswith(f"the staged file {damaged} is damaged (") and "\n" not in message, message
    assert message.endswith(f"stage the data again (delete {data.directory}; the next run stages it anew)"), message


@dataclass(frozen=True)
class DamagedCopy:
    name: str
    damage: object  # what happens to a rank's local copy of its tokens, given its path


def appended(path: str) -> None:
    with open(path, "ab") as file:
        file.write(b"\x01\x00")


DAMAGED_COPIES = [
    DamagedCopy("one-byte-short", lambda path: os.truncate(path, os.path.getsize(path) - 1)),
    DamagedCopy("one-id-short", lambda path: os.truncate(path, os.path.getsize(path) - 2)),
    DamagedCopy("emptied", lambda path: os.truncate(path, 0)),
    DamagedCopy("an-id-longer", appended),
    DamagedCopy("cut-in-half", cut_short),
]


@pytest.mark.parametrize("case", DAMAGED_COPIES, ids=lambda case: case.name)
def test_a_damaged_local_copy_of_the_tokens_is_made_again(case, staged_runs, tmp_path):
    import numpy as np

    data = copy_of(staged_runs, LANGUAGE, tmp_path / "staging")
    whole = np.array(data.shard("train", 1, 2))
    case.damage(data.shard("train", 1, 2).filename)
    again = data.shard("train", 1, 2)
    assert np.array_equal(again, whole) and len(whole) > 0


def test_the_matrices_of_damaged_files_keep_their_cases():
    assert len(DAMAGED_STAGED_FILES) >= 5 and len(DAMAGED_COPIES) >= 5
    assert len({case.name for case in DAMAGED_STAGED_FILES + DAMAGED_COPIES}) == 10
