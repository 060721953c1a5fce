"""`score` against the same model applied in one local process to the same rows, rows per second.

The language task's model at its `tiny` size scores TPC-H comments: ours is `score` as a job runs it
(Spark reads the table, the task's `prepare`, the rows split across local[2]'s Python workers, each loading the model
once, the output written as parquet); the baseline reads the same table with pyarrow and calls the task's `score` on
the same batches in this process, with torch's own threads. Both from a run folder made by hand (random weights: the
cost is the same). On 2 cores the ratio shows what Spark's split and hand-off cost; on a cluster the rows spread over
every executor (and GPU), which one process cannot.
"""

from __future__ import annotations

import os

from .measure import Row, alternate, seconds
from .synthetic import LANGUAGE_TASK, documents, text_statistics, write_parts

BATCH_SIZE = 512


def run(work_dir: str, quick: bool) -> list[Row]:
    import torch

    from distributed_training import scoring
    from distributed_training.data.staged import StagedData
    from distributed_training.engines.local_spark import local_spark_session
    from distributed_training.task_interface import load_task

    count, repetitions = (2_000, 3) if quick else (20_000, 5)
    task = load_task(LANGUAGE_TASK)
    options = task.Options(model_size="tiny")
    texts = documents(count)
    table, run_dir = os.path.join(work_dir, "scoring", "table"), os.path.join(work_dir, "scoring", "run")
    write_parts(table, {"o_comment": texts}, 2)
    StagedData(directory=os.path.join(run_dir, "staging"), task=LANGUAGE_TASK, source=table, train_rows=count,
               test_rows=0, files_per_split=2, stats=text_statistics(texts),
               recipe={"task_options": vars(options), "seed": 0}).save()
    model = task.build_model({}, options).eval()
    torch.save(model.state_dict(), os.path.join(run_dir, "model.pt"))
    with open(os.path.join(run_dir, "metrics.json"), "w") as file:
        file.write('{"engine": "torch_distributor"}')
    request = scoring.parse(["--model", run_dir, "--task", LANGUAGE_TASK, "--batch-size", str(BATCH_SIZE)])[0]
    spark = local_spark_session(2, os.path.join(work_dir, "scoring", "warehouse"))

    def ours() -> float:
        output = os.path.join(work_dir, "scoring", "scores")
        elapsed, rows = seconds(lambda: scoring.write(scoring.scored(spark, request), output))
        assert rows == count
        return rows / elapsed

    def one_process() -> float:
        import pyarrow.parquet as pq

        def score_all() -> int:
            rows = pq.read_table(table).to_pandas().rename(columns={"o_comment": "text"})
            scored = 0
            with torch.no_grad():
                for start in range(0, len(rows), BATCH_SIZE):
                    scored += len(task.score(model, rows.iloc[start:start + BATCH_SIZE], request.stats, options)
                                  ["nll_per_byte"])
            return scored

        elapsed, rows = seconds(score_all)
        assert rows == count
        return rows / elapsed

    try:
        measured = alternate({"ours": ours, "one process": one_process}, repetitions, warm_up=True)
    finally:
        spark.stop()
    return [Row("scoring", f"score {count:,} texts, causal_lm tiny (score)", "rows/s", tuple(measured["ours"]),
                tuple(measured["one process"]), f"baseline: the task's score in one process, batches of {BATCH_SIZE}",
                work={"rows": count, "batch_size": BATCH_SIZE})]
