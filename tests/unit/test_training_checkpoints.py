"""Checkpoints on one process: atomic files, the newest complete one resumed, a damaged one skipped, old ones pruned;
and a run resumed from a checkpoint ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json

import pytest
import torch

from distributed_training.training import distributed
from distributed_training.training.checkpoints import Checkpoints, complete_epochs, write_atomically
from distributed_training.training.config import TrainingConfig
from distributed_training.training.loop import train
from distributed_training.training.model import FareRegressor
from distributed_training.training.strategy import DataParallel

from test_training_model import stage_linear_data

IDENTITY = {"source": "test", "world_size": 1}


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return distributed.start(use_gpu=False)


def strategy_with_weights(process, value):
    strategy = DataParallel(process, learning_rate=1e-3, accumulation=1, precision="fp32")
    strategy.prepare(FareRegressor(2, (4,)))
    with torch.no_grad():
        for parameter in strategy.module.parameters():
            parameter.fill_(value)
    return strategy


def first_weight(strategy):
    return float(next(strategy.module.parameters()).detach().flatten()[0])


def test_an_interrupted_write_leaves_no_file_under_the_real_name(tmp_path):
    target = tmp_path / "state.pt"

    def write_half_then_die(file):
        file.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(str(target), write_half_then_die)
    assert not target.exists()


def test_the_newest_checkpoint_is_resumed_and_only_the_newest_are_kept(tmp_path, single_process):
    checkpoints = Checkpoints(str(tmp_path), single_process, keep=2, run_identity=IDENTITY, log=lambda *_: None)
    for epoch in (1, 2, 3):
        checkpoints.save(strategy_with_weights(single_process, float(epoch)), epoch, {"history": [epoch]})
    assert complete_epochs(str(tmp_path)) == [3, 2]

    fresh = strategy_with_weights(single_process, 0.0)
    marker = checkpoints.resume(fresh)
    assert marker["epoch"] == 3 and marker["history"] == [3] and first_weight(fresh) == 3.0


def test_a_truncated_checkpoint_is_skipped_for_the_one_before_it(tmp_path, single_process, capsys):
    checkpoints = Checkpoints(str(tmp_path), single_process, keep=3, run_identity=IDENTITY)
    for epoch in (1, 2):
        checkpoints.save(strategy_with_weights(single_process, float(epoch)), epoch, {"history": []})
    newest = tmp_path / "epoch-00002" / "state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    (tmp_path / "epoch-00003").mkdir()  # a save that died before its marker: not a checkpoint at all

    fresh = strategy_with_weights(single_process, 0.0)
    assert checkpoints.resume(fresh)["epoch"] == 1 and first_weight(fresh) == 1.0
    output = capsys.readouterr().out
    assert "cannot load" in output and "checkpoint of epoch 2 does not load on every rank: skipped" in output


def test_a_checkpoint_of_another_run_is_refused_with_the_fix(tmp_path, single_process):
    Checkpoints(str(tmp_path), single_process, keep=1, run_identity=IDENTITY, log=lambda *_: None).save(
        strategy_with_weights(single_process, 1.0), 1, {"history": []})
    other = Checkpoints(str(tmp_path), single_process, keep=1, run_identity={**IDENTITY, "world_size": 4})
    with pytest.raises(RuntimeError, match="belongs to another run.*--no-resume"):
        other.resume(strategy_with_weights(single_process, 0.0))


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    staged = stage_linear_data(tmp_path / "staging")
    whole = train(TrainingConfig(data=staged, output_dir=str(tmp_path / "whole"), epochs=4, batch_size=32,
                                 grad_accumulation=2))
    train(TrainingConfig(data=staged, output_dir=str(tmp_path / "split"), epochs=2, batch_size=32,
                         grad_accumulation=2))
    resumed = train(TrainingConfig(data=staged, output_dir=str(tmp_path / "split"), epochs=4, batch_size=32,
                                   grad_accumulation=2))

    assert resumed["resumed_from_epoch"] == 2 and [epoch["epoch"] for epoch in resumed["epochs"]] == [1, 2, 3, 4]
    for name in ("train_loss", "test_rmse", "test_mae"):
        assert [epoch[name] for epoch in resumed["epochs"]] == pytest.approx(
            [epoch[name] for epoch in whole["epochs"]], rel=1e-6)
    saved = json.loads((tmp_path / "split" / "checkpoints" / "epoch-00004" / "complete.json").read_text())
    assert saved["epoch"] == 4 and saved["run_identity"]["grad_accumulation"] == 2
