"""`train --table PATH` on data that cannot be trained on: text that is not UTF-8, files that are not parquet, a
folder with nothing in it, a column of the wrong type. Each case goes through the entry point and ends in one error
line that names the table, the column or file, and the fix: exit 1, no traceback, nothing of Py4J, nothing written.

In process, on the shared Spark session (the run's local session is that one, left running); through the command
line for the cases that used to end in a Java or pyarrow stack. The matrix is counted so it cannot shrink quietly."""

from __future__ import annotations

import os
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
