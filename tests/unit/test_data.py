"""Each rank reads its own share of the staged parquet files: disjoint, complete, refused when too few; the manifest
round-trips."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_training.data.staged import StagedData, files_for_rank, read_shard


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
    shares = [read_shard(split, rank, 3) for rank in range(3)]
    values = sorted(x for share in shares for x in share.column("x").to_pylist())
    assert values == list(range(40))
    assert all((np.array(share.column("y")) == 2 * np.array(share.column("x"))).all() for share in shares)


def test_fewer_files_than_processes_is_refused_with_the_fix(tmp_path):
    split = write_split(tmp_path / "train", file_count=2)
    with pytest.raises(ValueError, match="2 parquet file.* for 3 processes.*stage it again"):
        read_shard(split, 0, 3)
    empty = read_shard(split, 2, 3, require_rows=False)
    assert empty.num_rows == 0 and empty.column_names == ["x", "y"]


def test_a_split_without_files_is_refused(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no parquet files: stage the data again"):
        read_shard(str(tmp_path / "train"), 0, 1)


def test_the_manifest_round_trips_and_its_absence_or_damage_says_what_to_do(tmp_path):
    staged = StagedData(directory=str(tmp_path), task="t", source="somewhere", train_rows=8, test_rows=2,
                        files_per_split=2, stats={"x": {"mean": 1.0, "std": 2.0}})
    staged.save()
    assert StagedData.load(str(tmp_path)) == staged
    with pytest.raises(FileNotFoundError, match="manifest.json is missing.*Stage the data first"):
        StagedData.load(str(tmp_path / "elsewhere"))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="is damaged.*stage the data again"):
        StagedData.load(str(tmp_path))
