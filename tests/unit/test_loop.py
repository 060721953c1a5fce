"""The loop's own pieces on one process: the learning-rate schedules, AdamW's groups and options, the batches,
checkpoints that a rerun can trust, a resumed run that ends where an uninterrupted one does, and a loss that becomes
NaN."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from distributed_training.config import LR_SCHEDULES, Config
from distributed_training.data.staged import StagedData
from distributed_training.data.staging import stage
from distributed_training.files import write_atomically, write_folder_atomically
from distributed_training.run_folder import HF_MODEL_DIR
from distributed_training.task_interface import TaskError, load_task
from distributed_training.training import ranks
from distributed_training.training import loop
from distributed_training.training.checkpoints import Checkpoints, complete_steps, tag_of
from distributed_training.training.loop import NonFiniteLoss, ShuffledBatches, adamw, learning_rate_schedule, train
from distributed_training.training.strategy import DataParallel, checkpoint_weights

from support.runs import DROPOUT_FARES, FARE, LANGUAGE, resolved_config, staged

IDENTITY = {"source": "test", "world_size": 1}
BETAS = Config.adam_betas


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return ranks.start(use_gpu=False)


@pytest.mark.parametrize("shape", LR_SCHEDULES)
@pytest.mark.parametrize("updates", [2, 3, 7, 20, 100, 1001])
@pytest.mark.parametrize("warmup_fraction", [0.0, 0.05, 0.1, 0.5])
def test_the_schedule_peaks_at_the_end_of_warm_up_and_ends_on_the_floor(updates, warmup_fraction, shape):
    multiplier = learning_rate_schedule(updates, warmup_fraction, shape, floor=0.1)
    values = [multiplier(step) for step in range(updates)]  # the rate of each update the run takes
    warmup = int(updates * warmup_fraction)
    assert max(values) <= 1.0 and values[max(warmup - 1, 0)] == 1.0
    # the last update's rate is the floor (a constant schedule's is the peak's)
    assert values[-1] == pytest.approx(1.0 if shape == "constant" else 0.1, abs=1e-12)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values[warmup:], values[warmup + 1:]))
    assert all(earlier < later for earlier, later in zip(values[:warmup], values[1:warmup]))  # warm-up only climbs


@pytest.mark.parametrize("shape, after_warm_up", [
    ("cosine", [1.0, 0.96955, 0.88284, 0.75307, 0.6, 0.44693, 0.31716, 0.23045, 0.2]),
    ("linear", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]),
    ("constant", [1.0] * 9)])
def test_each_schedule_s_rate_at_every_update(shape, after_warm_up):
    """12 updates, 3 of warm-up up to the peak, a floor of 0.2: the decay goes from the peak at update 3 down to the
    floor at update 11, halfway at its midpoint, update 7; cosine's k-th: 0.2 + 0.4 (1 + cos(pi k / 8))."""
    multiplier = learning_rate_schedule(12, 0.25, shape, floor=0.2)
    assert [multiplier(step) for step in range(12)] == pytest.approx([1 / 3, 2 / 3, 1.0, *after_warm_up], abs=5e-6)
    assert multiplier(2) == multiplier(3) == 1.0 and multiplier(12) == multiplier(11)  # past the end: the last rate
    if shape == "linear":
        assert multiplier(7) == pytest.approx(0.6, abs=1e-15)


@pytest.mark.parametrize("accumulation, max_steps, expected", [(1, None, 3 * 25), (2, None, 3 * 12), (2, 10, 10),
                                                               (3, 1000, 3 * 8)])
def test_the_run_s_length_is_its_epochs_in_whole_updates_cut_by_max_steps(accumulation, max_steps, expected):
    config = resolved_config("/tmp/unused", FARE, epochs=3, grad_accumulation=accumulation, max_steps=max_steps)
    plan = loop.Plan.of(config, micro_batches=25, per_rank=25 * 64)
    assert plan.updates == expected and plan.updates_per_epoch == 25 // accumulation
    assert plan.epoch_of(plan.updates_per_epoch - 1) == 1 and plan.epoch_of(plan.updates_per_epoch) == 2


def sgd_strategy(process, model):
    strategy = DataParallel(process, "fp32", grad_clip=0.0)
    strategy.prepare(model, lambda model: torch.optim.SGD(model.parameters(), lr=1.0), lambda step: 1.0)
    return strategy


@pytest.mark.parametrize("task_name, sizes", [(FARE, (8, 8, 3)), (LANGUAGE, (4, 1, 2))])
def test_an_update_s_gradient_is_the_mean_over_every_item_of_its_window(spark, tmp_path, single_process, task_name,
                                                                       sizes):
    """Micro-batches of different sizes (a short last batch): the update is the gradient of the mean over all their
    examples (fare) or tokens (the LM's `count`), not the mean of the micro-batches' means."""
    config, data = staged(spark, resolved_config(tmp_path, task_name, processes=1), world_size=1, rows=400)
    task = load_task(task_name)
    examples = task.examples(data.shard("train", 0, 1), data.stats, config.task_options)
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    window = [tuple(tensor[start:start + size] for tensor in examples) for start, size in zip(starts, sizes)]
    torch.manual_seed(0)
    model = task.build_model(data.stats, config.task_options)
    reference = copy.deepcopy(model)
    strategy = sgd_strategy(single_process, model)
    loop.update(task, strategy, window, single_process)

    whole = tuple(torch.cat(parts) for parts in zip(*window))
    task.loss(reference, whole).backward()  # the mean over the whole window at once
    expected = {name: parameter - parameter.grad for name, parameter in reference.named_parameters()}
    for name, parameter in strategy.module.named_parameters():
        assert torch.allclose(parameter, expected[name], rtol=0, atol=1e-6), name
    means_of_means = sum(task.loss(copy.deepcopy(reference), part) for part in window) / len(window)
    whole_mean = task.loss(reference, whole)
    assert abs(float(means_of_means.detach()) - float(whole_mean.detach())) > 1e-4  # the sizes do differ in weight


def test_a_checkpoint_s_keys_are_the_plain_model_s_whether_compiled_or_not(tmp_path, single_process):
    plain = strategy_with_weights(single_process, 2.0)
    compiled = DataParallel(single_process, "fp32", grad_clip=1.0)
    compiled.prepare(torch.compile(torch.nn.Linear(2, 1)), lambda model: adamw(model, 1e-3, 0.0, BETAS),
                     lambda step: 1.0)
    assert all(name.startswith("_orig_mod.") for name in compiled.module.state_dict())  # what compile does
    compiled.save(str(tmp_path), "compiled")
    assert set(checkpoint_weights(str(tmp_path), "compiled")) == {"weight", "bias"}
    plain.save(str(tmp_path), "plain")
    compiled.load(str(tmp_path), "plain")  # a compiled run resumes a plain one's checkpoint, and back
    assert first_weight(compiled) == 2.0 and set(compiled.full_state_dict()) == {"weight", "bias"}


def test_a_longer_budget_on_resume_continues_on_the_longer_schedule(spark, tmp_path, single_process, monkeypatch):
    """--max-steps raised on a rerun: it resumes at the step reached, and from the next update on the rate is the
    longer schedule's at that step (higher than the shorter one's: no second warm-up, the cosine stretched)."""
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=5, max_steps=6, warmup_fraction=0.2,
                                              tracking=False), world_size=1, rows=800)
    rates = []
    real_update = loop.update
    monkeypatch.setattr(loop, "update", lambda task, strategy, *rest: (rates.append(strategy.learning_rate),
                                                                        real_update(task, strategy, *rest))[1])
    short = train(config)
    assert short["step"] == 6 and rates[-1] == pytest.approx(0.1 * config.learning_rate)
    rates.clear()
    longer = train(dataclasses.replace(config, max_steps=12))
    assert longer["resumed_from_step"] == 6 and longer["step"] == 12 and len(rates) == 6
    schedule = learning_rate_schedule(12, 0.2, "cosine", config.min_lr_ratio)
    assert rates == pytest.approx([config.learning_rate * schedule(step) for step in range(6, 12)], rel=1e-9)
    assert rates[0] > 0.1 * config.learning_rate


def test_a_raised_budget_lists_each_epoch_once_and_mlflow_keeps_one_meaning_a_key(spark, tmp_path, single_process,
                                                                                  monkeypatch):
    """--max-steps ends a run inside epoch 1; raised on a rerun, the run goes on to the end of epoch 2: metrics.json
    lists each epoch once (epoch 1's whole record), MLflow's `epoch` names each once, `train_loss` has one value a
    logged step (the window's; the epoch's mean is `epoch_train_loss`), and metrics.json has the step's time."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=2, max_steps=3, tracking=True,
                                              log_every_steps=1), world_size=1, rows=400)
    first = train(config)
    per_epoch = first["updates_per_epoch"]
    assert first["step"] == 3 < per_epoch and [epoch["epoch"] for epoch in first["epochs"]] == [1]
    resumed = train(dataclasses.replace(config, max_steps=None))
    assert resumed["resumed_from_step"] == 3 and resumed["mlflow_run_id"] == first["mlflow_run_id"]
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert [(epoch["epoch"], epoch["step"]) for epoch in written["epochs"]] == [(1, per_epoch), (2, 2 * per_epoch)]
    assert written["step_seconds"] > 0 and 0 <= written["data_wait_share"] < 1

    client = mlflow.MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")

    def history(name):
        return sorted((point.step, point.value) for point in client.get_metric_history(resumed["mlflow_run_id"], name))

    assert [step for step, _ in history("train_loss")] == list(range(1, 2 * per_epoch + 1))
    assert history("epoch") == [(per_epoch, 1.0), (2 * per_epoch, 2.0)]
    epoch_losses = history("epoch_train_loss")  # step 3's too: the first run's last record
    assert [step for step, _ in epoch_losses] == [3, per_epoch, 2 * per_epoch]
    assert [value for _, value in epoch_losses[1:]] == pytest.approx([epoch["train_loss"] for epoch in
                                                                      written["epochs"]], rel=1e-12)
    assert [step for step, _ in history("learning_rate")] == list(range(1, 2 * per_epoch + 1))


def test_a_resume_whose_mlflow_record_a_kill_cut_short_trains_on_in_a_new_mlflow_run(spark, tmp_path, single_process,
                                                                                     monkeypatch, capsys):
    """A local file store's run record (meta.yaml, which MLflow rewrites in place) left empty by a kill mid-write:
    the rerun says it cannot reopen that run, resumes its checkpoint all the same and tracks into a new MLflow run."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=1, max_steps=2, tracking=True,
                                              log_every_steps=1),
                       world_size=1, rows=400)
    first = train(config)
    (record,) = (tmp_path / "mlruns").glob(f"*/{first['mlflow_run_id']}/meta.yaml")
    record.write_text("")
    capsys.readouterr()
    resumed = train(dataclasses.replace(config, max_steps=4))
    assert resumed["resumed_from_step"] == 2 and resumed["step"] == 4
    assert f"MLflow cannot reopen run {first['mlflow_run_id']}" in capsys.readouterr().out
    client = mlflow.MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    new_run = client.get_run(resumed["mlflow_run_id"])
    assert resumed["mlflow_run_id"] != first["mlflow_run_id"] and new_run.info.status == "FINISHED"
    assert [point.step for point in client.get_metric_history(new_run.info.run_id, "train_loss")] == [3, 4]


def test_the_progress_line_shows_the_share_of_a_step_spent_waiting_and_the_time_left():
    plan = loop.Plan(epochs=2, updates_per_epoch=1000, updates=2000)
    figures = {"train_loss": 0.5, "learning_rate": 1e-3, "grad_norm": None, "tokens_per_second": None,
               "examples_per_second": 1000.0, "mfu": None, "step_seconds": 2.5, "data_wait_share": 0.125}
    assert loop.progress_line(50, plan, 1, figures) == (  # 1950 steps left at 2.5 s: 4875 s
        "step   50/2000  epoch 1  loss 0.5000  lr 1.00e-03  1,000 examples/s  2,500 ms a step (12.5% waiting for "
        "data)  1:21:15 left")
    assert loop.progress_line(2000, plan, 2, figures).endswith("  0:00:00 left")


def test_a_run_killed_after_its_last_checkpoint_finishes_on_its_rerun(spark, tmp_path, single_process):
    """Killed between its last checkpoint and metrics.json: the rerun resumes at the last step, trains nothing more,
    and writes what the run lacked (model.pt, metrics.json) with the records the checkpoint holds."""
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=2, max_steps=5, tracking=False),
                       world_size=1, rows=800)
    first = train(config)
    for name in ("metrics.json", "model.pt"):  # what a kill after the last checkpoint leaves unwritten
        (tmp_path / name).unlink()
    rerun = train(config)
    assert rerun["resumed_from_step"] == 5 and rerun["step"] == 5
    assert rerun["epochs"] == first["epochs"] and (tmp_path / "model.pt").exists()
    assert not (tmp_path / HF_MODEL_DIR).exists()  # the fare task has no save_pretrained
    assert json.loads((tmp_path / "metrics.json").read_text())["final"] == first["final"]


def test_the_run_and_its_model_are_freed_before_the_process_group_stops(spark, tmp_path, single_process, monkeypatch):
    """DDP's reducer freed after its process group was destroyed hangs a gloo rank at exit (torch 2.13, CPU: the
    group's destructor joins its loop thread, which waits for the GIL to free a finished all-reduce's tensors)."""
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=1, max_steps=2, tracking=False),
                       world_size=1, rows=800)
    alive_at_stop, stop = [], ranks.stop

    def stopping(process):
        # type(), not isinstance(): gc also holds dead weak proxies, on which isinstance raises ReferenceError
        alive_at_stop.extend(run for run in gc.get_objects() if type(run) is loop.Training and run.config is config)
        stop(process)

    monkeypatch.setattr(ranks, "stop", stopping)
    assert train(config)["step"] == 2 and alive_at_stop == []


def test_flops_per_token_count_the_whole_model_before_the_strategy_takes_it(spark, tmp_path, single_process,
                                                                           monkeypatch):
    """ZeRO 3 leaves each rank's parameters empty (0 elements outside a forward pass) once it holds the model: MFU's
    count of the weights comes before the strategy prepares it (a ZeRO 3 run's MFU was its attention's alone)."""
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=1, max_steps=1), world_size=1,
                       rows=400)
    prepare, seen = DataParallel.prepare, []

    def noted(self, model, *args):
        prepare(self, model, *args)
        seen.append("prepared")

    def flops_per_token(model, options):
        seen.append(sum(parameter.numel() for parameter in model.parameters()))
        return 1.0

    monkeypatch.setattr(DataParallel, "prepare", noted)
    monkeypatch.setattr(load_task(FARE).module, "flops_per_token", flops_per_token, raising=False)
    train(config)
    whole = sum(p.numel() for p in load_task(FARE).build_model(StagedData.load(config.staging_dir).stats,
                                                              config.task_options).parameters())
    assert seen == [whole, "prepared"]


def test_weight_decay_falls_on_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    groups = adamw(model, 1e-3, 0.1, (0.8, 0.99)).param_groups
    assert [(len(group["params"]), group["weight_decay"], group["lr"], group["betas"]) for group in groups] == [
        (1, 0.1, 1e-3, (0.8, 0.99)), (3, 0.0, 1e-3, (0.8, 0.99))]


def test_a_task_s_parameter_groups_get_their_own_rates_and_decay_on_their_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model[0].bias.requires_grad_(False)  # frozen: in no group of the optimizer's
    groups = [{"params": list(model[0].parameters()), "lr_scale": 1.0},
              {"params": list(model[1].parameters()), "lr_scale": 16.0}]
    made = adamw(model, 1e-3, 0.1, BETAS, groups).param_groups
    assert [([tuple(p.shape) for p in group["params"]], group["weight_decay"], group["lr"]) for group in made] == [
        ([(4, 3)], 0.1, 1e-3), ([(1, 4)], 0.1, 16e-3), ([(1,)], 0.0, 16e-3)]
    with pytest.raises(TaskError, match="parameter_groups leave 1 trainable parameter\\(s\\) of the model out"):
        adamw(model, 1e-3, 0.1, BETAS, groups[:1] + [{"params": [model[1].weight], "lr_scale": 16.0}])


def test_the_optimizer_options_and_the_task_s_groups_reach_every_update(spark, tmp_path, single_process,
                                                                         monkeypatch):
    """--adam-betas, --lr-schedule and --min-lr-ratio in a run, and a task's parameter_groups: the head at 4 times
    the rate; the rate reported is --learning-rate's at that point of the schedule."""
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, max_steps=5, warmup_fraction=0.2,
                                              adam_betas=(0.8, 0.99), lr_schedule="linear", min_lr_ratio=0.0),
                       world_size=1, rows=400)

    def head_at_four_times_the_rate(model, options):
        head = list(model.layers[-1].parameters())
        return [{"params": [p for p in model.parameters() if all(p is not own for own in head)]},
                {"params": head, "lr_scale": 4.0}]

    monkeypatch.setattr(sys.modules[FARE], "parameter_groups", head_at_four_times_the_rate, raising=False)
    seen = []
    real_update = loop.update
    monkeypatch.setattr(loop, "update", lambda task, strategy, *rest: (seen.append(
        (strategy.learning_rate, [(group["lr"], group["betas"]) for group in strategy.optimizer.param_groups])),
        real_update(task, strategy, *rest))[1])
    assert train(config)["step"] == 5
    rate = config.learning_rate
    assert [reported for reported, _ in seen] == pytest.approx([rate, rate, rate * 2 / 3, rate / 3, 0.0], abs=1e-15)
    reported, groups = seen[2]
    assert groups == [(reported, (0.8, 0.99))] * 2 + [(4 * reported, (0.8, 0.99))] * 2  # matrices, then the rest


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
    strategy = DataParallel(process, "fp32", grad_clip=1.0)
    strategy.prepare(torch.nn.Linear(2, 1), lambda model: adamw(model, 1e-3, 0.0, BETAS), lambda step: 1.0)
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


def test_a_folder_is_replaced_whole_and_another_writer_s_folder_beside_it_is_left_alone(tmp_path):
    target = tmp_path / "hf_model"

    def write(*names):
        def fill(folder):
            os.makedirs(folder)
            for name in names:
                (Path(folder) / name).write_text(name)
            if "half" in names:
                raise KeyboardInterrupt
        return fill

    write_folder_atomically(str(target), write("old"))
    with pytest.raises(KeyboardInterrupt):
        write_folder_atomically(str(target), write("new", "half"))
    assert [path.name for path in tmp_path.iterdir()] == ["hf_model"] and os.listdir(target) == ["old"]
    write("theirs")(f"{target}.partial-0123abcd")  # another writer's, mid-write (two score jobs, one output)
    write_folder_atomically(str(target), write("new"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hf_model", "hf_model.partial-0123abcd"]
    assert os.listdir(target) == ["new"] and os.listdir(f"{target}.partial-0123abcd") == ["theirs"]


def test_the_newest_checkpoint_is_resumed_and_only_the_newest_are_kept(tmp_path, single_process):
    checkpoints = Checkpoints(str(tmp_path), single_process, keep=2, run_identity=IDENTITY, log=lambda *_: None)
    for step in (10, 20, 30):
        checkpoints.save(strategy_with_weights(single_process, float(step)), step, {"history": [step]})
    assert complete_steps(str(tmp_path)) == [30, 20]
    fresh = strategy_with_weights(single_process, 0.0)
    marker = checkpoints.resume(fresh)
    assert marker["step"] == 30 and marker["history"] == [30] and first_weight(fresh) == 30.0


def test_a_truncated_checkpoint_is_skipped_for_the_one_before_it(tmp_path, single_process, capsys):
    checkpoints = Checkpoints(str(tmp_path), single_process, keep=3, run_identity=IDENTITY)
    for step in (1, 2):
        checkpoints.save(strategy_with_weights(single_process, float(step)), step, {"history": []})
    newest = tmp_path / tag_of(2) / "state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    (tmp_path / tag_of(3)).mkdir()  # a save that died before its marker: not a checkpoint at all
    fresh = strategy_with_weights(single_process, 0.0)
    assert checkpoints.resume(fresh)["step"] == 1 and first_weight(fresh) == 1.0
    output = capsys.readouterr().out
    assert "cannot load" in output and "checkpoint of step 2 does not load on every rank: skipped" in output


def test_a_checkpoint_of_another_run_is_refused_with_the_fix(tmp_path, single_process):
    Checkpoints(str(tmp_path), single_process, keep=1, run_identity=IDENTITY, log=lambda *_: None).save(
        strategy_with_weights(single_process, 1.0), 1, {"history": []})
    other = Checkpoints(str(tmp_path), single_process, keep=1, run_identity={**IDENTITY, "world_size": 4})
    with pytest.raises(RuntimeError, match="belongs to another run.*--no-resume"):
        other.resume(strategy_with_weights(single_process, 0.0))


def test_a_sharded_checkpoint_s_weights_are_read_without_dcp_s_single_process_warning(tmp_path):
    """--init-from an FSDP2 run: each rank reads the weights on its own (no_dist), which dcp would warn of in every
    such run; other warnings still show."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning, match="assuming the intent is to save in a single process"):  # what is hidden
        dcp.save({"model": {"weight": torch.full((2, 3), 7.0)}}, checkpoint_id=str(tmp_path / tag_of(1)), no_dist=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = checkpoint_weights(str(tmp_path), tag_of(1))
    assert set(weights) == {"weight"} and torch.equal(weights["weight"], torch.full((2, 3), 7.0))


def test_a_rank_whose_held_out_share_ends_early_pads_without_counting_the_padding(spark, tmp_path, single_process,
                                                                                  monkeypatch):
    """Every rank runs as many evaluation batches as the longest share (a collective in each under ZeRO 3); a shorter
    share repeats a batch as padding, which must not count. Two ranks of 520 rows (3 batches of 256) and 100 rows (1
    batch, then 2 of padding) score what one process scores on the 620 rows."""
    config, data = staged(spark, resolved_config(tmp_path, FARE, processes=1), world_size=1, rows=4000)
    task = load_task(FARE)
    held_out = task.examples(data.shard("test", 0, 1, require_rows=False), data.stats, config.task_options)
    assert len(held_out[0]) >= 620 and loop.EVALUATION_BATCH == 256
    torch.manual_seed(0)
    strategy = sgd_strategy(single_process, task.build_model(data.stats, config.task_options))
    whole = loop.evaluate(task, strategy, tuple(tensor[:620] for tensor in held_out), data.stats, single_process)
    assert whole["test_rows"] == 620

    passes, real_evaluate = [], task.evaluate
    monkeypatch.setattr(task, "evaluate", lambda *arguments: (passes.append(1), real_evaluate(*arguments))[1])
    monkeypatch.setattr(ranks, "max_over_ranks", lambda process, value: 3)  # the longer share's batches
    shorter_share = {}
    monkeypatch.setattr(ranks, "sum_dict_over_ranks", lambda process, sums: shorter_share.update(sums) or sums)
    loop.evaluate(task, strategy, tuple(tensor[520:620] for tensor in held_out), data.stats, single_process)
    assert len(passes) == 3 and shorter_share["rows"] == 100  # two passes of padding, not counted
    monkeypatch.setattr(ranks, "sum_dict_over_ranks",
                        lambda process, sums: {name: value + shorter_share[name] for name, value in sums.items()})
    both = loop.evaluate(task, strategy, tuple(tensor[:520] for tensor in held_out), data.stats, single_process)
    assert both["test_rows"] == 620 and both == pytest.approx(whole, rel=1e-6)  # float32 sums, other batches


class Interrupted(Exception):
    pass


def final_weights(output_dir) -> dict:
    steps = complete_steps(str(output_dir / "checkpoints"))
    return checkpoint_weights(str(output_dir / "checkpoints"), tag_of(steps[0]))


@pytest.mark.parametrize("task", [FARE, LANGUAGE, DROPOUT_FARES])  # the last: its random generators resume too
def test_a_run_killed_mid_epoch_between_step_checkpoints_ends_where_an_uninterrupted_one_does(
        spark, tmp_path, single_process, task, monkeypatch):
    config, _ = staged(spark, resolved_config(tmp_path / "whole", task, processes=1, epochs=3, grad_accumulation=2,
                                              checkpoint_every_steps=3, log_every_steps=2), world_size=1, rows=800)
    whole = train(config)
    per_epoch = whole["updates_per_epoch"]
    killed_in = per_epoch + 5  # epoch 2's sixth update: two past the checkpoint of step per_epoch + 3 (or + 4)
    resumable = max(step for step in range(1, killed_in) if step % 3 == 0 or step % per_epoch == 0)
    assert per_epoch < resumable < killed_in - 1 < 2 * per_epoch, "the kill must fall mid-epoch between checkpoints"
    split = dataclasses.replace(config, output_dir=str(tmp_path / "split"))
    staged(spark, split, world_size=1, rows=800)
    real_update, updates = loop.update, []

    def update_until_killed(*arguments):
        updates.append(1)
        if len(updates) == killed_in:
            raise Interrupted  # the process dies in the middle of an update, its last checkpoint two steps back
        return real_update(*arguments)

    monkeypatch.setattr(loop, "update", update_until_killed)
    with pytest.raises(Interrupted):
        train(split)
    monkeypatch.setattr(loop, "update", real_update)
    assert complete_steps(str(tmp_path / "split" / "checkpoints"))[0] == resumable
    resumed = train(split)

    assert whole["final"]["learning_rate"] == pytest.approx(0.1 * config.learning_rate)  # the last update's: the floor
    assert resumed["resumed_from_step"] == resumable and [epoch["epoch"] for epoch in resumed["epochs"]] == [1, 2, 3]
    ours, theirs = final_weights(tmp_path / "split"), final_weights(tmp_path / "whole")
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in theirs) < 1e-6
    for name in ("train_loss", "held_out_loss", "learning_rate"):
        assert [epoch[name] for epoch in resumed["epochs"]] == pytest.approx(
            [epoch[name] for epoch in whole["epochs"]], rel=1e-6)
    written = json.loads((tmp_path / "split" / "metrics.json").read_text())
    assert written["held_out_loss"] == resumed["held_out_loss"] and "baseline_loss" in written
    marker = json.loads((tmp_path / "split" / "checkpoints" / tag_of(3 * per_epoch) / "complete.json").read_text())
    assert (marker["step"], marker["epoch"], marker["run_identity"]["task"]) == (3 * per_epoch, 3, task)

    # the throughput counts the examples an epoch trains: whole updates of 2 batches of 32, a short last batch short
    per_rank = whole["train_examples"]
    batches = -(-per_rank // config.batch_size)
    trained = min((batches - batches % 2) * config.batch_size, per_rank)
    assert [epoch["examples_per_second"] * epoch["train_seconds"] for epoch in whole["epochs"]] == pytest.approx(
        [trained] * 3)


def test_a_loss_that_becomes_nan_stops_the_run_and_keeps_the_last_good_checkpoint(spark, tmp_path, single_process,
                                                                                   monkeypatch):
    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=3, tracking=True), world_size=1,
                       rows=400)
    loss = load_task(FARE).loss
    calls = []

    def nan_in_epoch_2(model, batch):  # the task's loss, until it is NaN from the second epoch's first step on
        calls.append(1)
        return loss(model, batch) * (float("nan") if len(calls) > 13 else 1.0)

    monkeypatch.setattr(load_task(FARE).module, "loss", nan_in_epoch_2)
    with pytest.raises(NonFiniteLoss, match="the training loss became nan by step .*: no checkpoint of it.*Lower "
                                            "--learning-rate"):
        train(config)
    steps = complete_steps(str(tmp_path / "checkpoints"))
    assert len(steps) == 1 and steps[0] < 13  # the last good one, epoch 1's; nothing of epoch 2
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


def test_the_logged_model_pins_what_loading_it_imports_and_every_step_metric_is_written(spark, tmp_path,
                                                                                        single_process, monkeypatch,
                                                                                        capfd):
    """The requirements are named, not inferred by MLflow in a subprocess: torch (without a local label such as
    +cpu, as pip installs it), the pickler, and the distribution that defines the model's class (this tool's
    FarePredictor); the model loads back and predicts; the buffered step metrics are all written by the run's end."""
    import importlib.metadata

    import mlflow

    config, _ = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=2, tracking=True,
                                              log_every_steps=1), world_size=1, rows=200)

    def inferred(*arguments, **keywords):
        raise AssertionError("MLflow was left to infer the model's requirements")

    monkeypatch.setattr(mlflow.models, "infer_pip_requirements", inferred)
    capfd.readouterr()
    metrics = train(config)
    assert "Saving pytorch model by Pickle" not in capfd.readouterr().err  # pickled on purpose: no notice of it
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    run = mlflow.get_run(metrics["mlflow_run_id"])
    (model,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    with open(mlflow.pyfunc.get_model_dependencies(model.model_uri)) as file:
        requirements = file.read().split()
    tool = importlib.metadata.packages_distributions()["distributed_training"][0]
    assert f"torch=={torch.__version__.partition('+')[0]}" in requirements
    assert {f"{tool}=={importlib.metadata.version(tool)}", f"cloudpickle=={importlib.metadata.version('cloudpickle')}"
            } <= set(requirements), requirements
    loaded = mlflow.pytorch.load_model(model.model_uri)
    assert type(loaded).__module__ == "distributed_training.tasks.fare_regression"
    # a signature from the input example (MLflow infers it only where scipy is installed: the local extra has it)
    (inputs,) = mlflow.models.get_model_info(model.model_uri).signature.inputs.to_dict()
    assert inputs["type"] == "tensor" and inputs["tensor-spec"]["shape"][0] == -1
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "grad_norm")  # a step report's alone
    assert sorted(point.step for point in history) == list(range(1, metrics["step"] + 1))


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
    per_epoch = first["updates_per_epoch"]
    onward = dataclasses.replace(earlier, output_dir=str(tmp_path / "full"), epochs=3, init_mode="full",
                                 init_from=str(tmp_path / "earlier" / "checkpoints" / tag_of(per_epoch)))
    stage(spark, load_task(FARE), onward, 1)  # the earlier run's table: the same data
    continued = train(onward)
    assert [epoch["epoch"] for epoch in continued["epochs"]] == [1, 2, 3]
    assert continued["resumed_from_step"] == per_epoch
    assert continued["epochs"][0] == first["epochs"][0]  # epoch 1 is the earlier run's own history

    again = train(onward)  # a rerun into its folder resumes its own newest checkpoint, not the earlier run's
    assert again["resumed_from_step"] == 3 * per_epoch

    other = dataclasses.replace(onward, output_dir=str(tmp_path / "other-seed"), seed=7)
    stage(spark, load_task(FARE), other, 1)
    with pytest.raises(RuntimeError, match=r"belongs to another run \(.*seed: 42 -> 7.*--init-mode weights"):
        train(other)
