"""TorchDistributor for real: two gloo processes on local Spark, on the driver and on the executors, for both tasks,
and the language model under FSDP2; a worker's failure comes back as one line; `train --local` works end to end as a
command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from distributed_training.data.staged import StagedData
from distributed_training.engines import LaunchError
from distributed_training.engines.torch_distributor import ENGINE
from distributed_training.run_folder import MODEL_FILE
from distributed_training.task_interface import load_task
from distributed_training.training.checkpoints import tag_of
from distributed_training.training.strategy import checkpoint_weights

from conftest import (FARE, LANGUAGE, assert_it_learned, environment, metrics_of, output_of, score_command,
                      train_command)

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("task, nodes, on_workers", [(FARE, 1, False), (FARE, 2, True), (FARE, 1, True),
                                                     (LANGUAGE, 1, False)],
                         ids=["fare-on-the-driver", "fare-on-the-executors", "fare-on-one-workers-executors",
                              "language-model-on-the-driver"])
def test_two_processes_learn(spark, staged_run, task, nodes, on_workers):
    """On the workers: local_mode=False, a barrier task on each of local[2]'s two slots, as on a cluster, whether they
    are two nodes of one process or one node of two (a num_workers=1 cluster, its driver only coordinating)."""
    config = staged_run(task, epochs=3, num_nodes=nodes, processes=2 // nodes, on_workers=on_workers)
    run = ENGINE.train(spark, config, {})
    assert_it_learned(run.metrics, task)
    assert run.metrics["world_size"] == 2 and metrics_of(Path(config.output_dir)) == run.metrics
    assert ("on the executors (local_mode=False)" if on_workers else "on the driver (local_mode=True)") \
        in run.description
    assert ("on one node" if nodes == 1 else f"on {nodes} nodes") in run.description
    if task == LANGUAGE:
        assert_scored_as_evaluated(spark, config, run.metrics["step"])


def assert_scored_as_evaluated(spark, config, step: int) -> None:
    """`score` on the language model's held-out rows: one row each, and each row's NLL per byte what the task's own
    `evaluate` gives for that text alone as one block, with the final checkpoint's weights (so: model.pt holds the
    trained weights, and a batch's padding changes no row's score)."""
    import torch

    from distributed_training import scoring
    from distributed_training.data.staged import StagedData

    scored = scoring.scored(spark, scoring.parse(["--model", config.output_dir, "--task", LANGUAGE, "--rows",
                                                  "held-out"])[0]).toPandas()
    staged = StagedData.load(config.staging_dir)
    assert len(scored) == staged.test_rows and scored["text"].str.len().nunique() > 1
    task = load_task(LANGUAGE)
    model = task.build_model(staged.stats, config.task_options).eval()
    model.load_state_dict(checkpoint_weights(config.checkpoint_dir, tag_of(step)))
    longest = scored.loc[scored["text"].str.len().idxmax()]
    assert len(longest["text"]) > model.context  # scored on its first `context` bytes
    for text, nll_per_byte in [*scored.sample(3, random_state=0)[["text", "nll_per_byte"]].values, longest.values]:
        data = text.encode("utf-8")[:model.context]
        with torch.no_grad():
            sums = task.evaluate(model, (torch.tensor([[task.END_OF_TEXT, *data]]),), staged.stats)
        assert nll_per_byte == pytest.approx(sums["nll"] / len(data), rel=1e-4), text
    # Every row of the table once: a held-out text's score among all the rows' is its own
    everything = scoring.scored(spark, scoring.parse(["--model", config.output_dir, "--task", LANGUAGE])[0])
    everything = everything.toPandas()
    assert len(everything) == spark.read.parquet(staged.source).count()
    assert everything["nll_per_byte"].notna().sum() == staged.train_rows + staged.test_rows
    column = config.task_options.text_column
    by_text = everything.dropna(subset=["nll_per_byte"]).drop_duplicates(column).set_index(column)["nll_per_byte"]
    for text, nll_per_byte in scored.sample(5, random_state=1)[["text", "nll_per_byte"]].values:
        assert by_text[text] == pytest.approx(nll_per_byte, rel=1e-5)


def test_the_language_model_learns_under_fsdp2_and_its_sharded_checkpoint_reads_back_whole(spark, staged_run):
    """--parallelism fsdp2: the transformer's blocks and the rest sharded over the two processes; the checkpoints are
    torch distributed checkpoints, whose weights one process without a process group reads whole, under the plain
    model's names (what --init-from reads, whatever the new run's number of processes)."""
    config = staged_run(LANGUAGE, epochs=3, parallelism="fsdp2")
    run = ENGINE.train(spark, config, {})
    assert_it_learned(run.metrics, LANGUAGE)
    final = Path(config.checkpoint_dir) / tag_of(run.metrics["step"])
    assert (final / ".metadata").exists() and not (final / "state.pt").exists()
    model = load_task(LANGUAGE).build_model({}, config.task_options)
    weights = checkpoint_weights(config.checkpoint_dir, final.name)
    model.load_state_dict(weights)  # strict: every name and shape
    trained = torch.load(Path(config.output_dir) / MODEL_FILE)  # the whole model as the run ended it
    assert all(torch.equal(weights[name], value) for name, value in trained.items())  # and every value


def test_a_failure_in_the_workers_comes_back_as_one_clear_error(spark, staged_run):
    # the language task's examples are blocks of tokens, which staging does not count: its loop refuses the window
    config = staged_run(LANGUAGE, epochs=1, grad_accumulation=100_000)
    with pytest.raises(LaunchError, match=r"rank \d: ValueError: .*fewer than one accumulation window") as error:
        ENGINE.train(spark, config, {})
    assert "\n" not in str(error.value)


def test_train_local_runs_end_to_end_as_a_command(tmp_path, spark):
    """With MLFLOW_TRACKING_URI naming a folder, as a user may set it: MLflow 3 takes it only when told to."""
    completed = train_command(tmp_path, "torch_distributor", FARE, "--epochs", "3", "--register-model", "fares",
                              env=environment(MLFLOW_TRACKING_URI=str(tmp_path / "tracking")))
    assert completed.returncode == 0, output_of(completed)
    assert f"metrics  {tmp_path / 'metrics.json'}" in completed.stdout
    assert "held-out loss" in completed.stdout and "the trivial predictor's" in completed.stdout
    assert (tmp_path / "staging" / "manifest.json").exists() and (tmp_path / "sample_table").is_dir()
    metrics = metrics_of(tmp_path)
    assert_it_learned(metrics, FARE)
    assert list((tmp_path / "tracking").glob(f"*/{metrics['mlflow_run_id']}/metrics/train_loss")), "not tracked there"

    # `score` on the run's held-out rows, split again from the same table: the same rows and the same model give the
    # run's own held-out RMSE. Twice into one output, by the run's folder and by its registered model (MLflow's run
    # records the folder): replaced, never appended to.
    scores = tmp_path / "scores"
    tracking = environment(MLFLOW_TRACKING_URI=str(tmp_path / "tracking"), MLFLOW_ALLOW_FILE_STORE="true")
    for model in (tmp_path, "models:/fares/1"):
        completed = score_command(model, "--rows", "held-out", "--output-table", str(scores), env=tracking)
        assert completed.returncode == 0, output_of(completed)
        assert f"Scored {metrics['final']['test_rows']:,} rows" in completed.stdout
    scored = pq.read_table(scores).to_pandas()
    assert len(scored) == metrics["final"]["test_rows"] and sorted(path.name for path in tmp_path.iterdir()
                                                                    if path.name.startswith("scores")) == ["scores"]
    rmse = float(np.sqrt(((scored["predicted_fare"] - scored["fare_amount"].astype(float)) ** 2).mean()))
    assert rmse == pytest.approx(metrics["final"]["test_rmse"], rel=1e-4)

    # Every row of the table (all its columns), each once, with a prediction where the task keeps the row, null where
    # its prepare drops it; and each prediction that row's own: the model applied here to that row's features alone.
    completed = score_command(tmp_path, "--output-table", str(scores))
    assert completed.returncode == 0, output_of(completed)
    staged = StagedData.load(str(tmp_path / "staging"))
    table = pq.read_table(staged.source).to_pandas()
    everything = spark.read.parquet(str(scores))
    assert everything.columns == [*table.columns, "predicted_fare"] and everything.count() == len(table)
    task = load_task(FARE)
    kept = task.prepare(everything, task.Options(), keep=("predicted_fare",)).toPandas()
    assert len(kept) == everything.where("predicted_fare IS NOT NULL").count() == staged.train_rows + staged.test_rows
    assert kept["predicted_fare"].notna().all()
    model = task.build_model(staged.stats, task.Options())
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    with torch.no_grad():
        own = task.score(model.eval(), kept, staged.stats, task.Options())["predicted_fare"]
    assert np.allclose(own, kept["predicted_fare"], rtol=1e-5)
