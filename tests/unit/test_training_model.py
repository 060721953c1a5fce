"""The model and the loop on a single process (the distributed runs are engine tests)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from distributed_training.training.config import TrainingConfig
from distributed_training.training.loop import train
from distributed_training.training.model import FareRegressor
from distributed_training.training.staged import ColumnStats, StagedData


def test_the_model_maps_a_batch_of_features_to_one_prediction_each():
    model = FareRegressor(in_features=6, hidden_sizes=(16, 8))
    predictions = model(torch.randn(5, 6))
    assert predictions.shape == (5,)
    predictions.sum().backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_a_config_with_nothing_to_do_is_refused():
    staged = StagedData("d", ("x",), "y", (ColumnStats(0, 1),), ColumnStats(0, 1), 1, 1, "s")
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        TrainingConfig(data=staged, output_dir="out", epochs=0)


def stage_linear_data(directory, rows=600, seed=0):
    """y = 3 x0 - 2 x1 + 10 plus a little noise, split 500/100, as the Spark staging would lay it out."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2))
    y = 3 * x[:, 0] - 2 * x[:, 1] + 10 + rng.normal(scale=0.1, size=rows)
    for split, part in (("train", slice(0, 500)), ("test", slice(500, rows))):
        (directory / split).mkdir(parents=True)
        table = pa.table({"x0": x[part, 0], "x1": x[part, 1], "y": y[part]})
        pq.write_table(table, directory / split / "part-00000.parquet")
    staged = StagedData(
        directory=str(directory), feature_columns=("x0", "x1"), label_column="y",
        feature_stats=tuple(ColumnStats(float(x[:500, i].mean()), float(x[:500, i].std())) for i in range(2)),
        label_stats=ColumnStats(float(y[:500].mean()), float(y[:500].std())),
        train_rows=500, test_rows=rows - 500, source="test",
    )
    staged.save()
    return staged


def test_one_process_learns_and_rank_zero_writes_its_metrics(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    staged = stage_linear_data(tmp_path / "staging")
    metrics = train(TrainingConfig(data=staged, output_dir=str(tmp_path), epochs=4, batch_size=32))

    assert metrics["world_size"] == 1 and metrics["train_rows"] == 500 and metrics["test_rows"] == 100
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert losses[-1] < losses[0] / 4
    assert metrics["final"]["test_rmse"] < metrics["final"]["baseline_rmse"] / 5
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
