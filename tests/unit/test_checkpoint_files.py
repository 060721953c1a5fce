"""Checkpoint files damaged after they were written (cut short, emptied, overwritten with other bytes, missing): each
is named in one line with what is wrong with it, and the fix names the checkpoint to take instead; an FSDP2
checkpoint reads back whole with the values the model had, or not at all."""

from __future__ import annotations

import pickle
import random
import socket
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.multiprocessing

from distributed_training.config import Config
from distributed_training.training import ranks
from distributed_training.training.checkpoints import Checkpoints, DamagedCheckpoint, complete_steps, tag_of
from distributed_training.training.loop import adamw
from distributed_training.training.strategy import DataParallel, FullyShardedDataParallel, checkpoint_weights

REFERENCE = "weights.pt"  # beside the checkpoints: the model's whole weights at the last one, as the run had them


def adamw_of(model, learning_rate=1e-3):
    return adamw(model, learning_rate, 0.0, Config.adam_betas)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, features):
        for block in self.blocks:
            features = torch.relu(block(features))
        return self.head(features).squeeze(-1)


def save_two_sharded_checkpoints(rank: int, port: int, folder: str) -> None:
    """One of two gloo processes: an FSDP2 model that takes a step before each of its checkpoints (steps 1 and 2)."""
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    process = ranks.start(use_gpu=False)
    torch.manual_seed(0)
    strategy = FullyShardedDataParallel(process, "fp32", grad_clip=1.0)
    strategy.prepare(strategy.build(Blocks), partial(adamw_of, learning_rate=1e-2), lambda step: 1.0)
    checkpoints = Checkpoints(folder, process, keep=2, run_identity={}, log=lambda *_: None)
    for step in (1, 2):
        features = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank))
        strategy.model(features).square().mean().backward()
        strategy.step()
        checkpoints.save(strategy, step, {})
    weights = strategy.full_state_dict()
    if process.is_main:
        torch.save(weights, os.path.join(folder, REFERENCE))
    ranks.stop(process)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fsdp2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.spawn(save_two_sharded_checkpoints, args=(port, str(folder)), nprocs=2)
    assert complete_steps(str(folder)) == [2, 1]
    return folder


@pytest.fixture
def sharded_copy(sharded, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(sharded, tmp_path / "checkpoints"))


def test_an_fsdp2_checkpoint_reads_back_whole_with_the_values_the_model_had(sharded):
    weights, saved = checkpoint_weights(str(sharded), tag_of(2)), torch.load(sharded / REFERENCE)
    assert sorted(weights) == sorted(saved) and len(saved) == 6
    for name, value in saved.items():
        assert torch.equal(weights[name], value), name


def drop_rank_1_s_chunks(folder: Path) -> None:
    """The metadata as if only rank 0 had saved: rank 1's shards are no longer part of the checkpoint."""
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    kept = {index: info for index, info in metadata.storage_data.items() if not info.relative_path.startswith("__1")}
    for name, item in metadata.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            item.chunks = [chunk for chunk in item.chunks
                           if any(index.fqn == name and index.offset == chunk.offsets for index in kept)]
    metadata.storage_data = kept
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def overwritten(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def removed(path: Path) -> None:
    path.unlink()


PROBLEMS = {cut_short: "is cut short or overwritten", emptied: "is empty", overwritten: "is cut short or overwritten",
            removed: "is missing"}
SHARD_CASES = [(file, damage) for file in ("__1_0.distcp", ".metadata") for damage in PROBLEMS]


@pytest.mark.parametrize("file, damage", SHARD_CASES, ids=[f"{file}-{damage.__name__}" for file, damage in SHARD_CASES])
def test_an_fsdp2_checkpoint_with_a_damaged_file_is_refused_naming_it_and_the_one_before(sharded_copy, file, damage):
    damage(sharded_copy / tag_of(2) / file)
    with pytest.raises(DamagedCheckpoint) as refusal:
        checkpoint_weights(str(sharded_copy), tag_of(2))
    if file == "__1_0.distcp":  # which shard does not read, DCP does not say
        named, problem = sharded_copy / tag_of(2), "has a shard that does not read (missing, cut short or overwritten)"
    else:
        named, problem = sharded_copy / tag_of(2) / file, PROBLEMS[damage]
    assert str(refusal.value) == f"{named} {problem}: take the checkpoint before it, {sharded_copy / tag_of(1)}"


def test_an_fsdp2_checkpoint_whose_metadata_lacks_a_rank_s_shards_is_refused(sharded_copy):
    drop_rank_1_s_chunks(sharded_copy / tag_of(1))
    with pytest.raises(DamagedCheckpoint) as refusal:
        checkpoint_weights(str(sharded_copy), tag_of(1))
    assert str(refusal.value) == (f"{sharded_copy / tag_of(1)}/.metadata lists only part of model.blocks.0.weight: "
                                  "a rank's shards are missing: no complete checkpoint comes before it: start fresh")


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return ranks.start(use_gpu=False)


def two_checkpoints(folder: Path, process) -> Checkpoints:
    """Steps 1 and 2 of a one-process run, whose single weight is the step's number."""
    checkpoints = Checkpoints(str(folder), process, keep=3, run_identity={"world_size": 1}, log=print)
    for step in (1, 2):
        strategy = DataParallel(process, "fp32", grad_clip=1.0)
        strategy.prepare(torch.nn.Linear(1, 1, bias=False), adamw_of, lambda step: 1.0)
        torch.nn.init.constant_(strategy.module.weight, float(step))
        checkpoints.save(strategy, step, {})
    return checkpoints


RESUME_CASES = [(file, damage) for file in ("state.pt", "rng-rank0.pt") for damage in (cut_short, emptied, overwritten)]


@pytest.mark.parametrize("file, damage", RESUME_CASES,
                         ids=[f"{file}-{damage.__name__}" for file, damage in RESUME_CASES])
def test_a_resume_names_the_damaged_file_and_takes_the_checkpoint_before_it(tmp_path, single_process, capsys, file,
                                                                           damage):
    checkpoints = two_checkpoints(tmp_path, single_process)
    damage(tmp_path / tag_of(2) / file)
    capsys.readouterr()
    strategy = DataParallel(single_process, "fp32", grad_clip=1.0)
    strategy.prepare(torch.nn.Linear(1, 1, bias=False), adamw_of, lambda step: 1.0)
    assert checkpoints.resume(strategy)["step"] == 1 and float(strategy.module.weight) == 1.0
    assert capsys.readouterr().out.splitlines() == [
        f"warning: rank 0 cannot load {tmp_path / tag_of(2)}: {tmp_path / tag_of(2) / file} {PROBLEMS[damage]}: "
        f"take the checkpoint before it, {tmp_path / tag_of(1)}",
        "warning: the checkpoint of step 2 does not load on every rank: skipped, trying the one before it",
        f"resuming from the checkpoint of step 1 ({tmp_path / tag_of(1)})"]


INIT_CASES = [(step, damage) for step in (1, 2) for damage in (cut_short, emptied, overwritten)]


@pytest.mark.parametrize("step, damage", INIT_CASES,
                         ids=[f"step-{step}-{damage.__name__}" for step, damage in INIT_CASES])
def test_init_from_a_damaged_state_file_names_it_and_the_checkpoint_to_take_instead(tmp_path, single_process, step,
                                                                                   damage):
    two_checkpoints(tmp_path, single_process)
    damage(tmp_path / tag_of(step) / "state.pt")
    with pytest.raises(DamagedCheckpoint) as refusal:
        checkpoint_weights(str(tmp_path), tag_of(step))
    fix = (f"take the checkpoint before it, {tmp_path / tag_of(1)}" if step == 2 else
           "no complete checkpoint comes before it: start fresh")
    assert str(refusal.value) == f"{tmp_path / tag_of(step) / 'state.pt'} {PROBLEMS[damage]}: {fix}"


def test_the_matrix_counts_its_cases():
    """8 damaged FSDP2 files, 6 damaged files a resume steps over, 6 damaged state files given to --init-from."""
    assert (len(SHARD_CASES), len(RESUME_CASES), len(INIT_CASES)) == (8, 6, 6)
