"""The fine-tuning task (tasks/fine_tune.py) on every strategy, proven as the other tasks' updates are
(test_distributed_equivalence.py): a small pretrained Llama with LoRA on two gloo ranks under DDP takes the same
updates as one process on the union of their micro-batches, with gradient accumulation, and leaves its frozen base as
it was; FSDP2 and DeepSpeed ZeRO 3 (frozen parameters in every unit and partition) take the updates DDP takes; a GPT-2,
whose output layer is its input embedding (tied), fine-tuned in full under FSDP2 takes one process's updates too.
Plain SGD at a constant rate, no clipping and no LoRA dropout: a constant factor on a gradient, or a rank's own
random numbers, would show."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from distributed_training.tasks import fine_tune

from support.equivalence import largest_difference, one_process_train, rank_examples, ranks_results
from support.runs import resolved_config, staged

pytestmark = pytest.mark.engine

FINE_TUNE = "distributed_training.tasks.fine_tune"
WORLD, STEPS, ACCUMULATION = 2, 4, 2
# fp32, the largest difference of a weight: the ranks' sums in another order than one process's (seen: 4e-9); FSDP2's
# and ZeRO 3's reduce-scatters against DDP's all-reduce (seen: 0 and 7e-10). The adapters move by 4e-3.
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def staged_fine_tune(spark, pretrained, tmp_path_factory):
    """The sample table's text staged for 2 ranks with the Llama's tokenizer, which is the GPT-2's too (both are
    trained on the same text: support/pretrained.py), so both models read the same staged ids."""
    llama, gpt2 = pretrained("llama"), pretrained("gpt2")
    assert fine_tune.tokenizer_of(llama).get_vocab() == fine_tune.tokenizer_of(gpt2).get_vocab()
    options = fine_tune.Options(base_model=llama, max_length=16, lora_rank=4, lora_dropout=0.0)
    config = resolved_config(tmp_path_factory.mktemp("fine-tune"), FINE_TUNE, batch_size=4, grad_clip=0.0,
                             grad_accumulation=ACCUMULATION, task_options=options)
    config, _ = staged(spark, config, world_size=WORLD, rows=200)
    per_rank = min(len(rank_examples(config, rank, WORLD)[0]) for rank in range(WORLD))
    assert per_rank >= STEPS * config.batch_size, "too few examples for the steps"
    return config, per_rank


@pytest.fixture(scope="module")
def lora_by_ddp(staged_fine_tune, tmp_path_factory) -> list[dict]:
    """The two DDP ranks' results, compared with one process, FSDP2 and ZeRO 3."""
    config, per_rank = staged_fine_tune
    return ranks_results(config, WORLD, STEPS, per_rank, tmp_path_factory.mktemp("ddp"))


def test_lora_on_two_ranks_takes_the_steps_one_process_takes_on_their_union(staged_fine_tune, lora_by_ddp):
    config, per_rank = staged_fine_tune
    ranks = [rank["weights"] for rank in lora_by_ddp]
    assert largest_difference(ranks[0], ranks[1]) == 0.0
    alone = one_process_train(config, WORLD, STEPS, per_rank)
    assert largest_difference(ranks[0], alone) < TOLERANCE
    untrained = one_process_train(config, WORLD, 0, per_rank)
    adapters = [name for name in untrained if "lora_" in name]
    assert len(adapters) == 2 * 7 * 2  # A and B of the 7 projections of 2 layers
    # the adapters moved, by far more than the tolerance; the base did not move at all
    assert largest_difference({name: alone[name] for name in adapters},
                              {name: untrained[name] for name in adapters}) > 1000 * TOLERANCE
    base = set(untrained) - set(adapters)
    assert base and all((ranks[0][name] == untrained[name]).all() for name in base)
    for rank in lora_by_ddp:  # one all-reduce of each bucket (the adapters' gradients) per update
        assert rank["reductions"] and set(rank["reductions"].values()) == {STEPS // ACCUMULATION}


def test_lora_under_fsdp2_takes_the_steps_ddp_takes(staged_fine_tune, lora_by_ddp, tmp_path):
    config, per_rank = staged_fine_tune
    by_fsdp = ranks_results(dataclasses.replace(config, parallelism="fsdp2"), WORLD, STEPS, per_rank, tmp_path)
    assert largest_difference(by_fsdp[0]["weights"], lora_by_ddp[0]["weights"]) < TOLERANCE
    assert by_fsdp[1]["weights"] == {}, "only rank 0 puts the whole model together"
    for rank in by_fsdp:
        assert rank["norms"] == pytest.approx(lora_by_ddp[0]["norms"], rel=1e-5)
        # each decoder layer's unit reduce-scatters its adapters' gradients once per update; the root's parameters
        # (the embeddings, the last norm, the output layer) are all frozen: it has none to reduce
        assert rank["reductions"] == {f"base_model.model.model.layers.{layer}": STEPS // ACCUMULATION
                                      for layer in range(2)}
    assert by_fsdp[0]["held_out"] == pytest.approx(lora_by_ddp[0]["held_out"], rel=1e-5)


def test_lora_under_deepspeed_zero_3_takes_the_steps_ddp_takes(staged_fine_tune, lora_by_ddp, tmp_path,
                                                              deepspeed_op_built):
    """The whole model's weights gathered at the end on rank 0 (ZeRO 3 holds a slice of each on every rank)."""
    config, per_rank = staged_fine_tune
    zero = dataclasses.replace(config, engine="deepspeed", zero_stage=3)
    by_zero = ranks_results(zero, WORLD, STEPS, per_rank, tmp_path)
    assert largest_difference(by_zero[0]["weights"], lora_by_ddp[0]["weights"]) < TOLERANCE
    assert [rank["deepspeed_updates"] for rank in by_zero] == [STEPS // ACCUMULATION] * WORLD
    assert by_zero[0]["held_out"] == pytest.approx(lora_by_ddp[0]["held_out"], rel=1e-5)


def test_full_fine_tuning_of_tied_embeddings_under_fsdp2_takes_one_process_s_steps(staged_fine_tune, pretrained,
                                                                                   tmp_path):
    """GPT-2's output layer is its input embedding: one parameter, trained once, and saved under both names."""
    config, per_rank = staged_fine_tune
    full = dataclasses.replace(config, parallelism="fsdp2", task_options=dataclasses.replace(
        config.task_options, base_model=pretrained("gpt2"), lora_rank=0))
    by_fsdp = ranks_results(full, WORLD, STEPS, per_rank, tmp_path)
    weights = by_fsdp[0]["weights"]
    assert torch.equal(weights["lm_head.weight"], weights["transformer.wte.weight"])
    alone = one_process_train(full, WORLD, STEPS, per_rank)
    assert largest_difference(weights, alone) < TOLERANCE
    untrained = one_process_train(full, WORLD, 0, per_rank)
    assert largest_difference(alone, untrained) > 1000 * TOLERANCE
