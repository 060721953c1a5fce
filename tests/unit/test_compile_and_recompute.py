"""--compile and --activation-checkpointing through the loop on one CPU process: a compiled run's checkpoints resume
without compiling and back, and recomputing the transformer's blocks (a pretrained model's decoder layers too) changes
the memory, not the weights or the gradients."""

from __future__ import annotations

import dataclasses
import shutil

import pandas as pd
import pytest
import torch

from distributed_training import config as configuration
from distributed_training.task_interface import load_task
from distributed_training.tasks.causal_lm import PRESETS
from distributed_training.training import ranks
from distributed_training.training.checkpoints import complete_steps, tag_of
from distributed_training.training.loop import recomputing, train
from distributed_training.training.strategy import checkpoint_weights

from support.runs import FARE, LANGUAGE, resolved_config, staged

# Inductor, torch.compile's compiler, builds C++ for the CPU; CI runs on a machine like this one, which has g++.
NO_CXX = not (shutil.which("g++") or shutil.which("clang++"))


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return ranks.start(use_gpu=False)


def test_both_are_off_by_default_and_the_language_model_takes_both():
    train_lm = ["--engine", "torch_distributor", "--task", LANGUAGE, "--local"]
    config = configuration.from_args(train_lm)
    assert not config.compile and not config.activation_checkpointing
    config = configuration.from_args([*train_lm, "--compile", "--activation-checkpointing"])
    configuration.check(config)  # the language model names its blocks (the fare task's refusal: test_train_refuses)
    assert config.compile and config.activation_checkpointing


def newest_weights(output_dir) -> dict:
    steps = complete_steps(str(output_dir / "checkpoints"))
    return checkpoint_weights(str(output_dir / "checkpoints"), tag_of(steps[0]))


@pytest.mark.skipif(NO_CXX, reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) and none is here")
def test_a_compiled_run_s_checkpoint_resumes_without_compiling_and_back(spark, tmp_path, single_process):
    config, data = staged(spark, resolved_config(tmp_path, FARE, processes=1, epochs=1, compile=True), world_size=1,
                          rows=400)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = train(config)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs  # it did compile
    plain_names = set(load_task(FARE).build_model(data.stats, config.task_options).state_dict())
    assert set(newest_weights(tmp_path)) == plain_names  # no `_orig_mod.` in a compiled run's checkpoint

    per_epoch = compiled["updates_per_epoch"]
    eager = train(dataclasses.replace(config, epochs=2, compile=False))
    assert eager["resumed_from_step"] == per_epoch and eager["epochs"][0] == compiled["epochs"][0]
    again = train(dataclasses.replace(config, epochs=3))
    assert again["resumed_from_step"] == 2 * per_epoch and again["step"] == 3 * per_epoch
    assert again["held_out_loss"] < compiled["held_out_loss"]


def test_recomputed_blocks_run_their_forward_twice_and_train_the_same_weights(spark, tmp_path, single_process,
                                                                               monkeypatch):
    """The same steps in fp32 with and without --activation-checkpointing: the same weights, and the blocks' insides
    run forward twice a micro-batch when recomputed (once in the forward pass, once more in the backward)."""
    task = load_task(LANGUAGE)
    build_model, calls = task.build_model, []

    def counted_model(stats, options):
        model = build_model(stats, options)
        for block in task.blocks(model):  # the forward passes that keep a graph for the backward (not eval's);
            # as they start: a recomputation stops once it has what the backward needs, before the block's end
            block.mlp.register_forward_pre_hook(lambda *_: calls.append(1) if torch.is_grad_enabled() else None)
        return model

    monkeypatch.setattr(task.module, "build_model", counted_model)  # the module: train loads the task anew
    config, _ = staged(spark, resolved_config(tmp_path / "stored", LANGUAGE, processes=1, epochs=1, max_steps=3,
                                              grad_accumulation=2), world_size=1, rows=400)
    stored = train(config)
    forward_passes = len(calls)
    assert forward_passes == 3 * 2 * PRESETS[config.task_options.model_size][0]  # steps x micro-batches x blocks

    calls.clear()
    recomputing = dataclasses.replace(config, output_dir=str(tmp_path / "recomputed"), activation_checkpointing=True)
    staged(spark, recomputing, world_size=1, rows=400)
    recomputed = train(recomputing)
    assert len(calls) == 2 * forward_passes
    ours, theirs = newest_weights(tmp_path / "recomputed"), newest_weights(tmp_path / "stored")
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in theirs) < 1e-6
    assert recomputed["final"]["train_loss"] == pytest.approx(stored["final"]["train_loss"], abs=1e-6)


@pytest.mark.skipif(NO_CXX, reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) and none is here")
def test_recomputed_blocks_still_compile():
    """--compile with --activation-checkpointing: torch.compile traces into each block's recomputing forward."""
    blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    for block in blocks:
        block.forward = recomputing(block.forward)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for block in blocks:
        block.compile()
    blocks(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_recomputed_decoder_layers_give_a_pretrained_model_the_same_gradients(pretrained, single_process, family,
                                                                            precision):
    """The fine-tuning task's decoder layers (its `blocks`, which take keyword arguments) recomputed as the loop does,
    in training mode with LoRA's dropout on and under the strategy's autocast (bf16 on CPU too): the same loss and
    gradients as keeping the activations, and each layer run forward twice a micro-batch."""
    from distributed_training.tasks import fine_tune
    from distributed_training.training.strategy import DataParallel

    options = fine_tune.Options(base_model=pretrained(family), max_length=16, lora_rank=4, lora_dropout=0.5)
    task = load_task("distributed_training.tasks.fine_tune")
    text = pd.DataFrame({"text": ["the red fox runs over the dog.", "the slow bird sings near the tree."] * 4})
    batch = task.examples(fine_tune.tokenize(text, options), {}, options)
    strategy = DataParallel(single_process, precision, grad_clip=0.0)
    torch.manual_seed(0)
    model = task.build_model({}, options).train()
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # LoRA's B starts at 0, which leaves A without a gradient
            parameter.data.normal_(std=0.1)
    calls, computed_in = [], set()
    for block in task.blocks(model):
        block.mlp.register_forward_pre_hook(lambda *_: calls.append(1) if torch.is_grad_enabled() else None)
        block.mlp.register_forward_hook(lambda _module, _inputs, output: computed_in.add(output.dtype))

    def loss_and_gradients():
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks in both runs
        with strategy.autocast():
            loss = task.loss(model, batch)
        loss.backward()
        return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    stored_loss, stored = loss_and_gradients()
    assert len(calls) == 2 and all(float(gradient.abs().max()) > 0 for gradient in stored.values())
    assert computed_in == {torch.bfloat16 if precision == "bf16" else torch.float32}
    for block in task.blocks(model):
        block.forward = recomputing(block.forward)
    recomputed_loss, recomputed = loss_and_gradients()
    assert len(calls) == 2 + 2 * 2  # the 2 layers forward in the forward pass, and again in the backward
    assert recomputed_loss == stored_loss
    assert max(float((recomputed[name] - stored[name]).abs().max()) for name in stored) <= 1e-6
