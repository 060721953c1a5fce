"""Staged once, trained many times: a rerun of the run uses its staged data (Spark runs no job for it), a changed
source is staged again, or refused where checkpoints were trained on the old data; the language task's tokens are
staged as uint16 ids, and each rank maps its share from one local copy."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import numpy as np
import pytest

from distributed_training.data.staged import MANIFEST, StagedData
from distributed_training.data.staging import TableError, read_table, stage
from distributed_training.task_interface import load_task

from support.runs import FARE, LANGUAGE, resolved_config


def write_sample(spark, task_name: str, path, rows: int, seed: int = 0) -> str:
    load_task(task_name).sample_table(spark, seed).limit(rows).coalesce(1).write.mode("overwrite").parquet(str(path))
    return str(path)


def staged_files(config) -> dict[str, float]:
    found = {}
    for folder, _, names in os.walk(config.staging_dir):
        for name in names:
            found[os.path.join(folder, name)] = os.stat(os.path.join(folder, name)).st_mtime_ns
    return found


def spark_jobs_of(spark, run) -> tuple[object, int]:
    """What run() returns, and how many Spark jobs it started."""
    context = spark.sparkContext
    group = f"staging-{os.urandom(4).hex()}"
    context.setJobGroup(group, "counted")
    try:
        result = run()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return result, len(context.statusTracker().getJobIdsForGroup(group))


def test_a_rerun_uses_the_data_it_staged_and_spark_stages_nothing(spark, tmp_path, capsys):
    config = resolved_config(tmp_path / "run", FARE)
    config = dataclasses.replace(config, table=write_sample(spark, FARE, tmp_path / "table", 400))
    first, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 2))
    assert jobs > 0 and first.recipe["fingerprint"]["of"].startswith("1 file(s), ")
    files = staged_files(config)

    _, reading = spark_jobs_of(spark, lambda: read_table(spark, config.table, "unused"))  # the schema's footer
    again, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 2))
    assert jobs == reading < 3, "the rerun staged again"
    assert again == first and staged_files(config) == files
    assert f"using the data staged at {config.staging_dir}" in capsys.readouterr().out

    # Another number of processes, or another seed, is a different staging of the same table
    other, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 3))
    assert jobs > 0 and other.files_per_split == 3 and other.staging_id != first.staging_id
    reseeded = dataclasses.replace(config, seed=config.seed + 1)
    other_seed, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), reseeded, 3))
    assert jobs > reading and other_seed.staging_id != other.staging_id
    again, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), reseeded, 3))
    assert jobs == reading and again == other_seed


def rewrite_in_place(path: str, fare_change: float) -> dict[str, tuple[int, int]]:
    """The table's one file rewritten under its name, its fares changed, in a layout whose size depends only on the
    number of rows (no compression, dictionary or statistics); each file's (size, modification time) after."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    (name,) = [os.path.join(path, name) for name in os.listdir(path) if name.endswith(".parquet")]
    rows = pq.read_table(name).replace_schema_metadata(None)  # Spark's schema in it: timestamps that pyarrow's are not
    fares = rows.schema.get_field_index("fare_amount")
    rows = rows.set_column(fares, "fare_amount", pc.add(rows.column(fares), fare_change))
    pq.write_table(rows, name, compression="none", use_dictionary=False, write_statistics=False, coerce_timestamps="us")
    with contextlib.suppress(FileNotFoundError):  # Spark's checksum of the file it wrote: another tool leaves none
        os.unlink(os.path.join(path, f".{os.path.basename(name)}.crc"))
    return {name: (os.stat(name).st_size, os.stat(name).st_mtime_ns)}


def test_a_table_rewritten_in_place_with_the_same_names_and_sizes_is_staged_again(spark, tmp_path):
    import pyarrow.parquet as pq

    def staged_fares(data):
        return np.sort(np.concatenate([pq.read_table(directory).column("fare_amount").to_numpy()
                                       for directory in (data.train_dir, data.test_dir)]))

    config = resolved_config(tmp_path / "run", FARE)
    config = dataclasses.replace(config, table=write_sample(spark, FARE, tmp_path / "table", 400))
    before = rewrite_in_place(config.table, 0.0)
    first = stage(spark, load_task(FARE), config, 2)
    first_fares = staged_fares(first)
    after = rewrite_in_place(config.table, 1.0)
    sizes = lambda files: {name: size for name, (size, _) in files.items()}  # noqa: E731
    assert sizes(after) == sizes(before) and after != before

    second, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 2))
    assert jobs > 2 and second.staging_id != first.staging_id
    assert second.recipe["fingerprint"] != first.recipe["fingerprint"]
    assert np.allclose(staged_fares(second), first_fares + 1.0)  # the rows as rewritten, every one


def test_another_delta_version_of_a_table_is_staged_again_and_the_same_one_reused(spark, tmp_path, monkeypatch):
    """A table by name is identified by its Delta version (DESCRIBE HISTORY): local Spark has no Delta, so the
    history's answer is the test's, and the table itself a real one of the session's warehouse."""
    table = f"default.trips_{os.urandom(4).hex()}"
    load_task(FARE).sample_table(spark, 0).limit(400).write.saveAsTable(table)
    version, sql = [3], spark.sql

    def history_or_sql(query, *args, **kwargs):
        if query.startswith(f"DESCRIBE HISTORY {table}"):
            return spark.createDataFrame([(version[0],)], "version long")
        return sql(query, *args, **kwargs)

    monkeypatch.setattr(spark, "sql", history_or_sql)
    config = resolved_config(tmp_path / "run", FARE, table=table)
    first = stage(spark, load_task(FARE), config, 2)
    assert first.recipe["fingerprint"] == {"of": "Delta version 3"}
    again, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 2))
    assert jobs < 3 and again == first
    version[0] = 4
    newer, jobs = spark_jobs_of(spark, lambda: stage(spark, load_task(FARE), config, 2))
    assert jobs > 2 and newer.staging_id != first.staging_id
    assert newer.recipe["fingerprint"] == {"of": "Delta version 4"}


def test_a_changed_table_is_staged_again(spark, tmp_path):
    config = resolved_config(tmp_path / "run", FARE)
    config = dataclasses.replace(config, table=write_sample(spark, FARE, tmp_path / "table", 400))
    first = stage(spark, load_task(FARE), config, 2)
    write_sample(spark, FARE, tmp_path / "table", 300)
    second = stage(spark, load_task(FARE), config, 2)
    assert second.recipe["fingerprint"] != first.recipe["fingerprint"]
    assert second.train_rows + second.test_rows < first.train_rows + first.test_rows
    assert StagedData.load(config.staging_dir) == second


def test_a_changed_table_refuses_to_resume_what_was_trained_on_the_old_data(spark, tmp_path):
    config = resolved_config(tmp_path / "run", FARE)
    config = dataclasses.replace(config, table=write_sample(spark, FARE, tmp_path / "table", 400))
    first = stage(spark, load_task(FARE), config, 2)
    checkpoint = os.path.join(config.checkpoint_dir, "step-00000004")
    os.makedirs(checkpoint)
    open(os.path.join(checkpoint, "complete.json"), "w").write("{}")
    write_sample(spark, FARE, tmp_path / "table", 300)

    with pytest.raises(TableError, match=r"changed since this run staged it \(1 file\(s\), [\d,]+ bytes, last written "
                                         r"[\d:\- ]+ UTC, listing \w+ then, .* now\).*Start a new run.*--no-resume"):
        stage(spark, load_task(FARE), config, 2)
    assert StagedData.load(config.staging_dir) == first  # refused before anything was touched

    restaged = stage(spark, load_task(FARE), dataclasses.replace(config, resume=False), 2)
    assert restaged.staging_id != first.staging_id


def test_a_half_done_staging_leaves_no_manifest_to_trust(spark, tmp_path, monkeypatch):
    config = resolved_config(tmp_path / "run", FARE)
    config = dataclasses.replace(config, table=write_sample(spark, FARE, tmp_path / "table", 400))
    first = stage(spark, load_task(FARE), config, 2)
    untouched = staged_files(config)
    write_sample(spark, FARE, tmp_path / "table", 300)

    class Broken:  # the task fails before anything is written: the old staging stays whole, and says what it holds
        def __getattr__(self, name):
            return getattr(load_task(FARE), name)

        def statistics(self, train, options):
            raise RuntimeError("the executors were lost")

    with pytest.raises(RuntimeError, match="executors were lost"):
        stage(spark, Broken(), config, 2)
    assert staged_files(config) == untouched and StagedData.load(config.staging_dir) == first

    from pyspark.sql.readwriter import DataFrameWriter

    write_parquet = DataFrameWriter.parquet

    def lost(writer, path, *args, **kwargs):
        if path == os.path.join(config.staging_dir, "train"):
            raise RuntimeError("the executors were lost")
        return write_parquet(writer, path, *args, **kwargs)

    monkeypatch.setattr(DataFrameWriter, "parquet", lost)  # cut short as it writes: the old manifest is gone first
    with pytest.raises(RuntimeError, match="executors were lost"):
        stage(spark, load_task(FARE), config, 2)
    assert not os.path.exists(os.path.join(config.staging_dir, MANIFEST))


def test_the_language_task_stages_uint16_tokens_and_each_rank_maps_one_local_copy(spark, tmp_path):
    config = resolved_config(tmp_path / "run", LANGUAGE)
    config = dataclasses.replace(config, table=write_sample(spark, LANGUAGE, tmp_path / "table", 600))
    data = stage(spark, load_task(LANGUAGE), config, 2)
    assert data.token_dtype == "uint16"

    shares = [data.shard("train", rank, 2) for rank in range(2)]
    assert all(isinstance(share, np.memmap) and share.dtype == np.uint16 and len(share) > 0 for share in shares)
    # Every token of the split once: the documents' bytes and one end-of-text token each, as `statistics` counts them
    assert sum(len(share) for share in shares) == data.stats["tokens"]
    counts = np.bincount(np.concatenate(shares), minlength=257)
    assert counts.tolist() == data.stats["token_counts"]
    copy = shares[0].filename
    made = os.stat(copy).st_mtime_ns
    again = data.shard("train", 0, 2)
    assert again.filename == copy and os.stat(copy).st_mtime_ns == made and np.array_equal(again, shares[0])

    # A new staging's copies replace the old ones on the node
    write_sample(spark, LANGUAGE, tmp_path / "table", 500)
    restaged = stage(spark, load_task(LANGUAGE), config, 2)
    fresh = restaged.shard("train", 0, 2)
    assert fresh.filename != copy and not os.path.exists(copy)
    assert len(restaged.shard("test", 1, 2, require_rows=False)) > 0


def test_staging_caches_nothing_as_serverless_compute_refuses_it(spark, tmp_path, monkeypatch):
    """The stage task of a serverless GPU job runs on serverless compute, which refuses DataFrame caching (Databricks
    docs, "Serverless compute limitations"; before environment 5, `[NOT_SUPPORTED_WITH_SERVERLESS] PERSIST TABLE`):
    staging must not call it. The prepared rows it wrote and read back are gone once the splits are written."""
    from pyspark.sql import DataFrame

    def refused(*_args, **_kwargs):
        raise AssertionError("[NOT_SUPPORTED_WITH_SERVERLESS] PERSIST TABLE is not supported on serverless compute")

    monkeypatch.setattr(DataFrame, "persist", refused)
    monkeypatch.setattr(DataFrame, "cache", refused)
    config = resolved_config(tmp_path / "run", LANGUAGE)
    config = dataclasses.replace(config, table=write_sample(spark, LANGUAGE, tmp_path / "table", 300))
    data = stage(spark, load_task(LANGUAGE), config, 2)
    assert data.train_rows + data.test_rows == 300
    assert sorted(os.listdir(config.staging_dir)) == [MANIFEST, "test", "train"]


def test_the_same_rows_are_held_out_however_the_table_is_partitioned_or_ordered(spark, tmp_path):
    """The split is a seeded hash of each prepared row, so score's --rows held-out finds the run's held-out rows
    again from a table that Spark reads in other partitions, and identical rows never straddle the split."""
    from distributed_training.data.staging import TEST_FRACTION, split

    table = read_table(spark, write_sample(spark, FARE, tmp_path / "table", 2000), "unused")
    prepared = load_task(FARE).prepare(table, load_task(FARE).Options())
    held_out = lambda rows: sorted(map(tuple, split(rows, seed=7)[1].collect()))  # noqa: E731
    once = held_out(prepared)
    assert once == held_out(prepared.repartition(5).orderBy(prepared.columns[-1], ascending=False))
    assert abs(len(once) / prepared.count() - TEST_FRACTION) < 0.05
    assert held_out(prepared.unionAll(prepared)) == sorted(once + once)  # both copies of a row on the same side
    train = sorted(map(tuple, split(prepared, seed=7)[0].collect()))
    assert len(train) + len(once) == prepared.count() and not set(train) & set(once)
    assert held_out(prepared) != sorted(map(tuple, split(prepared, seed=8)[1].collect()))  # the seed decides


def test_a_run_that_stages_removes_the_staged_rows_of_runs_that_finished_long_ago_and_only_theirs(spark, tmp_path,
                                                                                                  capsys):
    """A schedule's runs each stage the table into their own folder: a new run removes the staged rows (train/ and
    test/, not the manifest that score reads) of the runs beside it that finished over --keep-staged-days ago, and of
    no run that has not finished (a retry or repair resumes it on them) or that trains now. A finished run continued
    further (a larger --max-steps) stages its unchanged table again: the same rows, the same held-out rows."""
    import pyarrow.parquet as pq

    from distributed_training.run_folder import held

    table, runs, now = write_sample(spark, FARE, tmp_path / "table", 400), tmp_path / "torch_distributor", time.time()

    def run(name: str, finished_days_ago: float | None = None, keep_days: int = 0):
        config = resolved_config(runs / name, FARE, table=table, keep_staged_days=keep_days)
        data = stage(spark, load_task(FARE), config, 2)
        if finished_days_ago is not None:
            (runs / name / "metrics.json").write_text("{}")
            os.utime(runs / name / "metrics.json", (now - finished_days_ago * 86_400,) * 2)
        return config, data

    old, old_data = run("101", finished_days_ago=30)
    held_out = pq.read_table(old_data.test_dir).to_pandas()
    run("102", finished_days_ago=1)
    run("103")  # not finished, though staged long ago
    os.utime(runs / "103", (now - 30 * 86_400,) * 2)
    run("104", finished_days_ago=30)  # finished, and continued further right now: its folder is held
    capsys.readouterr()
    with held(str(runs / "104")):
        run("105", keep_days=7)
    assert capsys.readouterr().out.count("removed the staged rows of") == 1
    assert sorted(os.listdir(runs / "101" / "staging")) == [MANIFEST]
    for kept in ("102", "103", "104", "105"):
        assert sorted(os.listdir(runs / kept / "staging")) == [MANIFEST, "test", "train"], kept
    again = stage(spark, load_task(FARE), old, 2)  # the old run, continued
    assert (again.train_rows, again.test_rows, again.stats) == (old_data.train_rows, old_data.test_rows,
                                                                old_data.stats)
    again_held_out = pq.read_table(again.test_dir).to_pandas()
    in_order = lambda rows: rows.sort_values(list(rows.columns)).reset_index(drop=True)  # noqa: E731
    assert in_order(again_held_out).equals(in_order(held_out))
