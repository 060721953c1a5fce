"""How `score` puts the scores back on the rows, and how many models it puts on each GPU.

Every row of the table comes back once, with the scores of its own content: the key is made of the row, not of where
a read found it, so the two reads of the table that the join makes agree even where they split the files differently
(monotonically_increasing_id, the key before, depends on the split). On one node Spark schedules no GPUs (local mode,
one task a core), so `score` bounds the model copies itself: as many tasks as `--models-per-gpu` times the node's
GPUs, each task's model on its partition's GPU (Databricks docs, "GPU scheduling": task GPU resources apply to
multi-node clusters only). The GPU count is faked here: this machine has none."""

from __future__ import annotations

import collections
import types

import pytest

from distributed_training import scoring
from distributed_training.scoring import ROW, ScoringError, gpu_of, row_key, shared_gpus


def key_by_content(table) -> dict:
    return {repr(row[:-1]): row[-1] for row in table.withColumn(ROW, row_key(table)).collect()}


def test_a_rows_key_is_its_content_however_the_files_are_split(spark, tmp_path):
    from pyspark.sql import functions as F

    path = str(tmp_path / "table")
    spark.range(3000).select((F.col("id") % 1000).alias("a.b"), (F.col("id") * 0.5).alias("x"),
                             F.create_map(F.lit("k"), F.col("id") % 7).alias("tags")) \
        .repartition(4).write.parquet(path)
    numbers = lambda table: {repr(row[:-1]): row[-1] for row in  # noqa: E731
                             table.withColumn(ROW, F.monotonically_increasing_id()).collect()}
    pieces = spark.read.parquet(path)  # a split a file, or more
    split_in, keyed, numbered = pieces.rdd.getNumPartitions(), key_by_content(pieces), numbers(pieces)
    settings = {"spark.sql.files.maxPartitionBytes": str(1 << 30), "spark.sql.files.openCostInBytes": "0",
                "spark.sql.files.minPartitionNum": "1"}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:  # the same files, all read in one split
        whole = spark.read.parquet(path)
        assert whole.rdd.getNumPartitions() == 1 < split_in
        assert key_by_content(whole) == keyed
        assert numbers(whole) != numbered  # the row number the join used before: another read, other numbers
    finally:
        for name in settings:
            spark.conf.unset(name)
    keys = [tuple(key) for key in keyed.values()]
    assert len(set(keys)) == len(keys) == 3000  # distinct rows, distinct keys (a map column, a dotted name)


def test_every_row_comes_back_once_with_its_own_scores_duplicates_included(spark):
    table = spark.createDataFrame([(index % 50, float(index % 50)) for index in range(200)], "n long, x double")

    def score_rows(keyed, keep):  # a task that drops odd rows and scores the rest with 2x, read in other partitions
        return keyed.repartition(7).where("n % 2 = 0").selectExpr("x * 2 AS doubled", *keep)

    joined = scoring.every_row_once(table, score_rows, ["doubled"]).collect()
    assert len(joined) == 200 and sorted(row.n for row in joined) == sorted(row.n for row in table.collect())
    assert all(row.doubled == (2 * row.x if row.n % 2 == 0 else None) for row in joined)


@pytest.mark.parametrize("gpus, models_per_gpu", [(1, 1), (2, 1), (4, 3)])
def test_on_one_node_each_gpu_holds_models_per_gpu_models_at_most(spark, tmp_path, monkeypatch, gpus,
                                                                   models_per_gpu):
    from pyspark import TaskContext

    from distributed_training.task_interface import load_task

    from support.runs import FARE

    import torch

    task = load_task(FARE)
    stats = {name: {"mean": 0.0, "std": 1.0} for name in (*task.FEATURES, task.LABEL)}
    torch.save(task.build_model(stats, task.Options()).state_dict(), tmp_path / "model.pt")
    table = task.sample_table(spark, 0).limit(400).repartition(8)  # 8 partitions: a core's share of a bigger node
    monkeypatch.setattr(scoring, "shared_gpus", lambda _spark: gpus)
    request = scoring.Scoring(run_dir=str(tmp_path), engine="torch_distributor", task=FARE, options=task.Options(),
                              stats=stats, seed=0, source=None, table="trips", output="", held_out=False,
                              batch_size=64, models_per_gpu=models_per_gpu)
    scored = scoring.scored_by_model(table, task, request)
    # The tasks that score, and the GPU each one's model goes to (the workers' own choice, gpu_of, in each task)
    placed = scored.mapInPandas(lambda batches: [__import__("pandas").DataFrame(
        {"gpu": [gpu_of(TaskContext.get(), gpus)]})], "gpu int").collect()
    assert len(placed) == gpus * models_per_gpu  # one model a task (a worker runs one task at a time)
    assert collections.Counter(row.gpu for row in placed) == {gpu: models_per_gpu for gpu in range(gpus)}


def test_a_multi_node_cluster_that_gives_tasks_no_gpus_is_refused_before_any_model_loads():
    def session(**conf):
        return types.SimpleNamespace(conf=types.SimpleNamespace(get=lambda name, default=None: conf.get(name, default)))

    cluster = {"spark.master": "spark://10.0.0.1:7077", "spark.executor.resource.gpu.amount": "4"}
    assert shared_gpus(session(**cluster, **{"spark.task.resource.gpu.amount": "1"})) == 0  # Spark gives each its own
    assert shared_gpus(session(**{**cluster, "spark.executor.resource.gpu.amount": "0"})) == 0  # a CPU cluster
    with pytest.raises(ScoringError, match=r"spark.task.resource.gpu.amount is 0\): every Python worker would load"):
        shared_gpus(session(**cluster, **{"spark.task.resource.gpu.amount": "0"}))
    assert shared_gpus(session(**{"spark.master": "local[*, 4]"})) == 0  # one node here: this machine's 0 GPUs
