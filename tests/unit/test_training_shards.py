"""Each rank reads its own share of the staged parquet files: disjoint, complete, refused when too few."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_training.training.staged import ColumnStats, StagedData, files_for_rank, read_shard


@pytest.mark.parametrize("file_count", [1, 2, 5, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_shares_of_all_ranks_are_disjoint_and_cover_every_file(file_count, world_size):
    files = [f"part-{index:05d}.parquet" for index in range(file_count)]
    shares = [files_for_rank(files, rank, world_size) for rank in range(world_size)]
    assert sorted(name for share in shares for name in share) == files  # complete, and nothing twice
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_rank_outside_the_world_is_an_error():
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        files_for_rank(["a.parquet"], 2, 2)


def write_split(directory, file_count, rows_per_file=10):
    directory.mkdir()
    for index in range(file_count):
        values = np.arange(index * rows_per_file, (index + 1) * rows_per_file, dtype=np.float64)
        pq.write_table(pa.table({"x": values, "y": values * 2}), directory / f"part-{index:05d}-c000.snappy.parquet")
    (directory / "_SUCCESS").touch()  # what Spark leaves beside its files; not data
    return str(directory)


def test_the_rows_read_by_all_ranks_are_the_whole_split(tmp_path):
    split = write_split(tmp_path / "train", file_count=4)
    shares = [read_shard(split, ["y", "x"], rank, 3) for rank in range(3)]
    rows = np.vstack(shares)
    assert rows.dtype == np.float32 and rows.shape == (40, 2)
    assert sorted(rows[:, 1]) == list(range(40)) and (rows[:, 0] == 2 * rows[:, 1]).all()


def test_fewer_files_than_processes_is_refused_with_the_fix(tmp_path):
    split = write_split(tmp_path / "train", file_count=2)
    with pytest.raises(ValueError, match="2 parquet file.* for 3 processes.*stage it again"):
        read_shard(split, ["x"], 0, 3)
    assert read_shard(split, ["x"], 2, 3, require_rows=False).shape == (0, 1)


def test_the_manifest_round_trips_and_its_absence_says_what_to_do(tmp_path):
    staged = StagedData(directory=str(tmp_path), feature_columns=("x",), label_column="y",
                        feature_stats=(ColumnStats(1.0, 2.0),), label_stats=ColumnStats(3.0, 4.0),
                        train_rows=8, test_rows=2, source="somewhere")
    staged.save()
    assert StagedData.load(str(tmp_path)) == staged
    with pytest.raises(FileNotFoundError, match="manifest.json is missing.*Stage the data first"):
        StagedData.load(str(tmp_path / "elsewhere"))
