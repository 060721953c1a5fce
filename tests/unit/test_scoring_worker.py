"""What a Spark Python worker does in `score`: it loads the run's model once, and again when model.pt was rewritten
(a longer rerun into the run's folder trains on and writes it anew; a worker outlives one Spark job)."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from distributed_training import scoring
from distributed_training.task_interface import load_task

from support.runs import FARE


def test_a_worker_scores_with_the_model_file_as_it_is_now(tmp_path, monkeypatch):
    task = load_task(FARE)
    options = task.Options()
    stats = {name: {"mean": 0.0, "std": 1.0} for name in (*task.FEATURES, task.LABEL)}
    rows = pd.DataFrame({name: [1.0, 2.0, 3.0] for name in (*task.FEATURES, task.LABEL)})
    loads, original = [], scoring._load
    monkeypatch.setattr(scoring, "_load", lambda *arguments: loads.append(arguments[1]) or original(*arguments))

    fares = []
    for bias, mtime in ((0.0, 1_000_000_000), (0.0, 1_000_000_000), (5.0, 2_000_000_000)):
        torch.manual_seed(0)
        model = task.build_model(stats, options)
        with torch.no_grad():
            model.layers[-1].bias.fill_(bias)
        torch.save(model.state_dict(), tmp_path / "model.pt")
        os.utime(tmp_path / "model.pt", ns=(mtime, mtime))
        parts = list(scoring.score_batches(iter([rows]), str(tmp_path), FARE, options, stats, batch_size=2))
        scored = pd.concat(parts, ignore_index=True)
        assert len(parts) == 2 and len(scored) == len(rows)
        assert list(scored.columns) == [*rows.columns, "predicted_fare"]
        fares.append(scored["predicted_fare"].to_numpy())
    assert len(loads) == 2  # once for the first file, once for the rewritten one: not for the second batch
    assert fares[1] == pytest.approx(fares[0]) and fares[2] - fares[0] == pytest.approx([5.0] * 3)
