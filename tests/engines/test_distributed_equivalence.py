"""Distributed math, proven rather than assumed, for both tasks: two ranks over gloo take the same updates as one
process does on the union of their micro-batches (fp32, with and without gradient accumulation), with SGD at a
constant rate and no clipping, so that a constant factor on the gradient (a loss scaled twice, or not at all, by the
window or the ranks) fails; their weights stay identical; DDP reduces once per update, not once per micro-batch;
DeepSpeed ZeRO 2 takes the same updates as DDP, stepping at the same accumulation boundary; FSDP2 takes the same
updates as DDP, clipping included, and reduce-scatters once per update; two ranks' held-out metrics are one process's
over the same examples; and the ranks' shards of the staged data are disjoint and cover it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pyarrow.parquet as pq
import pytest
from distributed_training.data.staged import read_shard

from conftest import FARE, LANGUAGE
from support.equivalence import largest_difference, one_process_evaluation, one_process_train, rank_examples, \
    ranks_results
from support.runs import resolved_config, staged

pytestmark = pytest.mark.engine

WORLD, STEPS = 2, 6
TOLERANCE = 1e-6
CLIP = 0.5  # below the gradients' norm in these runs' first updates: clipping scales them


def two_ranks(config, per_rank: int, results) -> list[dict]:
    return ranks_results(config, WORLD, STEPS, per_rank, results)


@pytest.fixture(scope="module", params=[FARE, LANGUAGE], ids=["fare", "language-model"])
def staged_task(request, spark, tmp_path_factory):
    config = resolved_config(tmp_path_factory.mktemp("equivalence"), request.param, batch_size=8, grad_clip=0.0)
    config, data = staged(spark, config, world_size=WORLD, rows=600)
    per_rank = min(len(rank_examples(config, rank, WORLD)[0]) for rank in range(WORLD))
    assert per_rank >= STEPS * config.batch_size, "too few examples for the steps"
    return config, data, per_rank


@pytest.fixture(scope="module")
def ddp_ranks(staged_task, tmp_path_factory):
    """The two DDP ranks' weights after STEPS, per accumulation: taken once, compared with one process and with
    ZeRO 2 (each comparison spawns real processes: half a minute apiece on two cores)."""
    config, _, per_rank = staged_task
    taken = {}

    def ranks(accumulation: int) -> list[dict]:
        if accumulation not in taken:
            taken[accumulation] = two_ranks(dataclasses.replace(config, grad_accumulation=accumulation), per_rank,
                                            tmp_path_factory.mktemp("ddp"))
        return taken[accumulation]

    return ranks


def test_the_ranks_shards_are_disjoint_and_cover_the_staged_rows(staged_task):
    """As multisets: the shards' rows together are exactly the split's rows, so none is read twice or left out."""
    _, data, _ = staged_task
    for split, rows in ((data.train_dir, data.train_rows), (data.test_dir, data.test_rows)):
        shards = [read_shard(split, rank, WORLD, require_rows=False) for rank in range(WORLD)]
        assert all(shard.num_rows > 0 for shard in shards)
        if data.token_dtype is None:  # else the rows are runs of token ids, not the table's rows
            assert sum(shard.num_rows for shard in shards) == rows
        together = Counter(tuple(row.values()) for shard in shards for row in shard.to_pylist())
        whole = Counter(tuple(row.values()) for row in pq.read_table(split).to_pylist())
        assert together == whole
    if data.token_dtype:  # every training token once: each document's bytes and its end-of-text, as counted
        assert sum(len(data.shard("train", rank, WORLD)) for rank in range(WORLD)) == data.stats["tokens"]


@pytest.mark.parametrize("accumulation", [1, 3])
def test_two_ranks_take_the_steps_one_process_takes_on_their_union(staged_task, ddp_ranks, accumulation):
    config, _, per_rank = staged_task
    config = dataclasses.replace(config, grad_accumulation=accumulation)
    ranks = [rank["weights"] for rank in ddp_ranks(accumulation)]
    assert largest_difference(ranks[0], ranks[1]) == 0.0  # the ranks hold identical weights
    alone = one_process_train(config, WORLD, STEPS, per_rank)
    assert largest_difference(ranks[0], alone) < TOLERANCE
    untrained = one_process_train(config, WORLD, 0, per_rank)
    # the updates moved the weights, by far more than the tolerance: a gradient off by a constant factor fails
    assert largest_difference(alone, untrained) > 1000 * TOLERANCE


def test_ddp_reduces_the_gradients_once_per_update_not_once_per_micro_batch(ddp_ranks):
    """6 micro-batches at an accumulation of 3: 2 all-reduces of each gradient bucket on each rank (DDP decides in
    the forward pass whether the backward reduces, so the forward must run under no_sync too)."""
    for rank in ddp_ranks(3):
        assert rank["reductions"] and set(rank["reductions"].values()) == {STEPS // 3}, rank["reductions"]
    for rank in ddp_ranks(1):
        assert set(rank["reductions"].values()) == {STEPS}


def test_two_ranks_held_out_metrics_are_one_process_s_over_the_same_examples(staged_task, ddp_ranks):
    config, _, _ = staged_task
    ranks = ddp_ranks(1)
    assert ranks[0]["held_out"] == ranks[1]["held_out"]
    alone = one_process_evaluation(config, ranks[0]["weights"], WORLD)
    assert ranks[0]["held_out"].keys() == alone.keys()
    for name, value in alone.items():
        assert ranks[0]["held_out"][name] == pytest.approx(value, rel=1e-6), name


@pytest.mark.parametrize("accumulation", [1, 3])
def test_deepspeed_zero_2_takes_the_steps_ddp_takes(staged_task, ddp_ranks, tmp_path, accumulation,
                                                   deepspeed_op_built):
    config, _, per_rank = staged_task
    zero = dataclasses.replace(config, grad_accumulation=accumulation, engine="deepspeed", zero_stage=2)
    by_ddp = ddp_ranks(accumulation)
    by_zero = two_ranks(zero, per_rank, tmp_path)
    assert largest_difference(by_zero[0]["weights"], by_zero[1]["weights"]) == 0.0
    assert largest_difference(by_zero[0]["weights"], by_ddp[0]["weights"]) < TOLERANCE
    # DeepSpeed's own accumulation boundary is the loop's window: it stepped once per window
    assert [rank["deepspeed_updates"] for rank in by_zero] == [STEPS // accumulation] * WORLD


def test_fsdp2_takes_the_steps_ddp_takes_with_clipping_and_reduces_once_per_update(staged_task, tmp_path):
    """Accumulation 2, clipping on: the same weights as DDP and the same gradient norms (a plain number, not FSDP2's
    DTensor); each FSDP2 unit (each of the LM's blocks, and the root) reduce-scatters its gradients once per update,
    not once per micro-batch."""
    config, _, per_rank = staged_task
    config = dataclasses.replace(config, grad_accumulation=2, grad_clip=CLIP)
    (tmp_path / "ddp").mkdir(), (tmp_path / "fsdp2").mkdir()
    by_ddp = two_ranks(config, per_rank, tmp_path / "ddp")
    by_fsdp = two_ranks(dataclasses.replace(config, parallelism="fsdp2"), per_rank, tmp_path / "fsdp2")
    assert largest_difference(by_fsdp[0]["weights"], by_ddp[0]["weights"]) < TOLERANCE
    assert by_fsdp[1]["weights"] == {}, "only rank 0 puts the whole model together"
    for rank in by_fsdp:
        assert rank["norms"] == pytest.approx(by_ddp[0]["norms"], rel=1e-5)
        assert rank["reductions"] == {unit: STEPS // 2 for unit in units(config)}, rank["reductions"]
    assert max(by_ddp[0]["norms"]) > CLIP, "clipping never bit: the test proves nothing of it"
    assert by_fsdp[0]["held_out"] == pytest.approx(by_ddp[0]["held_out"], rel=1e-5)


def units(config) -> list[str]:
    """FSDP2's units: the root, and each block of the LM's ModuleList (the tiny model has 2)."""
    return ["root", "blocks.0", "blocks.1"] if config.task == LANGUAGE else ["root"]
