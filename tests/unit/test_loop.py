"""The loop's own pieces on one process: the learning-rate schedule, AdamW's groups, the batches, checkpoints that a
rerun can trust, a resumed run that ends where an uninterrupted one does, and a loss that becomes NaN."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from distributed_training.files import write_atomically
from distributed_training.staging import stage
from distributed_training.task_interface import load_task
from distributed_training.training import distributed
from distributed_training.training.checkpoints import Checkpoints, complete_epochs
from distributed_training.training.loop import NonFiniteLoss, ShuffledBatches, adamw, train, warmup_then_cosine
from distributed_training.training.strategy import DataParallel

from support.runs import FARE, LANGUAGE, resolved_config, staged

IDENTITY = {"source": "test", "world_size": 1}


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return distributed.start(use_gpu=False)


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    multiplier = warmup_then_cosine(updates=100, warmup_fraction=0.1)
    values = [multiplier(step) for step in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values[10:], values[11:]))  # then only down
    assert values[-1] == pytest.approx(0.1, abs=1e-3)
    assert warmup_then_cosine(updates=10, warmup_fraction=0.0)(0) == pytest.approx(1.0)


def test_weight_decay_falls_on_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    groups = adamw(model, 1e-3, 0.1).param_groups
    assert [(len(group["params"]), group["weight_decay"]) for group in groups] == [(1, 0.1), (3, 0.0)]


def test_batches_cover_every_example_once_an_epoch_in_an_order_the_epoch_decides():
    examples = (torch.arange(10), torch.arange(10) * 2)
    batches = ShuffledBatches(examples, batch_size=4, seed=1)
    batches.set_epoch(3)
    first = list(batches)
    assert [len(batch[0]) for batch in first] == [4, 4, 2]
    assert sorted(torch.cat([batch[0] for batch in first]).tolist()) == list(range(10))
    assert all(torch.equal(batch[1], batch[0] * 2) for batch in first)  # the tensors are sliced together
    batches.set_epoch(4)
    batches.set_epoch(3)  # a resumed run sets the epoch it resumes at: the same order
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, batches))


def strategy_with_weights(process, value):
    strategy = DataParallel(process, "fp32", accumulation=1, grad_clip=1.0)
    strategy.prepare(torch.nn.Linear(2, 1), lambda model: adamw(model, 1e-3, 0.0), lambda step: 1.0)
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
    assert list(tmp_path.iterdir()) == []


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


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("task", [FARE, LANGUAGE])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(spark, tmp_path, single_process, task, monkeypatch):
    config, _ = staged(spark, resolved_config(tmp_path / "whole", task, processes=1, epochs=4, grad_accumulation=2),
                       world_size=1, rows=800)
    whole = train(config)
    split = dataclasses.replace(config, output_dir=str(tmp_path / "split"))
    staged(spark, split, world_size=1, rows=800)
    save = Checkpoints.save

    def save_then_stop_after_epoch_2(self, strategy, epoch, progress):
        save(self, strategy, epoch, progress)
        if epoch == 2:
            raise Interrupted  # the process dies right after its second checkpoint

    monkeypatch.setattr(Checkpoints, "save", save_then_stop_after_epoch_2)
    with pytest.raises(Interrupted):
        train(split)
    monkeypatch.setattr(Checkpoints, "save", save)
    resumed = train(split)

    assert resumed["resumed_from_epoch"] == 2 and [epoch["epoch"] for epoch in resumed["epochs"]] == [1, 2, 3, 4]
    for name in ("train_loss", "held_out_loss", "learning_rate"):
        assert [epoch[name] for epoch in resumed["epochs"]] == pytest.approx(
            [epoch[name] for epoch in whole["epochs"]], rel=1e-6)
    written = json.loads((tmp_path / "split" / "metrics.json").read_text())
    assert written["held_out_loss"] == resumed["held_out_loss"] and "baseline_loss" in written
    marker = json.loads((tmp_path / "split" / "checkpoints" / "epoch-00004" / "complete.json").read_text())
    assert marker["epoch"] == 4 and marker["run_identity"]["task"] == task

    # the throughput counts the examples an epoch trains: whole updates of 2 batches of 32, a short last batch short
    per_rank = whole["train_examples"]
    batches = -(-per_rank // config.batch_size)
    trained = min((batches - batches % 2) * config.batch_size, per_rank)
    assert [epoch["examples_per_second"] * epoch["train_seconds"] for epoch in whole["epochs"]] == pytest.approx(
        [trained] * 4)


def test_a_loss_that_becomes_nan_stops_the_run_and_keeps_the_last_good_checkpoint(spark, tmp_path, single_process,
                                                                                   monkeypatch):
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=3, tracking=True), world_size=1,
                       rows=400)
    loss = load_task(FARE).loss
    calls = []

    def nan_in_epoch_2(model, batch):  # the task's loss, until it is NaN from the second epoch's first step on
        calls.append(1)
        return loss(model, batch) * (float("nan") if len(calls) > 13 else 1.0)

    monkeypatch.setattr(load_task(FARE), "loss", nan_in_epoch_2)
    with pytest.raises(NonFiniteLoss, match="the loss became nan in epoch 2.*Lower --learning-rate"):
        train(config)
    assert complete_epochs(str(tmp_path / "checkpoints")) == [1]  # the last good one; nothing of epoch 2
    assert not (tmp_path / "metrics.json").exists()
    import mlflow

    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FAILED"
    assert mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list") == []


def test_two_local_runs_in_one_process_track_into_their_own_folders(spark, tmp_path, single_process, monkeypatch):
    """MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI; a second run in the same interpreter (a notebook) must
    not take the first run's folder for the user's choice."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name in ("first", "second"):
        config, _ = staged(spark, resolved_config(tmp_path / name, FARE, processes=1, epochs=1, tracking=True),
                           world_size=1, rows=200)
        train(config)
    import os

    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert [len(list((tmp_path / name / "mlruns").glob("*/*/meta.yaml"))) for name in ("first", "second")] == [1, 1]


def test_a_new_run_starts_from_an_earlier_runs_weights_or_its_whole_state(spark, tmp_path, single_process):
    """--init-from: weights alone (a fresh optimizer, schedule and epoch count), or the whole state of a run like it;
    a run that differs is refused with what differs; and a rerun of the new run resumes its own checkpoint."""
    earlier, _ = staged(spark, resolved_config(tmp_path / "earlier", FARE, processes=1, epochs=2), world_size=1,
                        rows=600)
    first = train(earlier)

    # Weights alone, with a learning rate too small to move them: the new run scores what the earlier one ended with.
    still = dataclasses.replace(earlier, output_dir=str(tmp_path / "weights"), init_from=earlier.output_dir,
                                learning_rate=1e-12, epochs=1)
    staged(spark, still, world_size=1, rows=600)
    warm = train(still)
    assert warm["held_out_loss"] == pytest.approx(first["held_out_loss"], rel=1e-4)
    assert [epoch["epoch"] for epoch in warm["epochs"]] == [1] and warm["init_from"] == earlier.output_dir
    cold = dataclasses.replace(still, output_dir=str(tmp_path / "weights-cold"), init_from=None)
    staged(spark, cold, world_size=1, rows=600)
    cold = train(cold)
    assert cold["held_out_loss"] > 2 * first["held_out_loss"]  # the same run without them learns nothing

    # The whole state of one checkpoint: the epochs go on from it, in a run of its own (a new MLflow run).
    onward = dataclasses.replace(earlier, output_dir=str(tmp_path / "full"), epochs=3, init_mode="full",
                                 init_from=str(tmp_path / "earlier" / "checkpoints" / "epoch-00001"))
    stage(spark, load_task(FARE), onward, 1)  # the earlier run's table: the same data
    continued = train(onward)
    assert [epoch["epoch"] for epoch in continued["epochs"]] == [1, 2, 3] and continued["resumed_from_epoch"] == 1
    assert continued["epochs"][0] == first["epochs"][0]  # epoch 1 is the earlier run's own history

    again = train(onward)  # a rerun into its folder resumes its own newest checkpoint, not the earlier run's
    assert again["resumed_from_epoch"] == 3

    other = dataclasses.replace(onward, output_dir=str(tmp_path / "other-seed"), seed=7)
    stage(spark, load_task(FARE), other, 1)
    with pytest.raises(RuntimeError, match=r"belongs to another run \(.*seed: 42 -> 7.*--init-mode weights"):
        train(other)
