"""A pretrained model loaded and saved by two ranks, each rank's peak resident memory measured against one
from_pretrained in one process (about 10M parameters, 40 MB in float32). The peak is Linux's VmHWM, reset before each
phase (/proc/self/clear_refs, "5"), less the resident memory at the reset.

- DDP and DeepSpeed (ranks.built_on_main): rank 0 loads the model; the other builds its structure on the meta device
  and gets rank 0's weights, one copy on its device (here the CPU, so in its resident memory too).
- FSDP2 (FullyShardedDataParallel.build and prepare): every rank shards the structure on the meta device; rank 0
  loads the model on the CPU and sends each rank its shards. The other rank never holds the whole model: half of it,
  and one tensor in flight. Saving gathers the whole model on rank 0 alone (full_state_dict).

The figures go to the README's fine-tuning section; `-s` prints them."""

from __future__ import annotations

import gc
import os
import re
import shutil

import psutil
import pytest
import torch

from distributed_training.tasks import fine_tune
from distributed_training.training import ranks
from distributed_training.training.strategy import FullyShardedDataParallel

from support.equivalence import free_port, sgd

pytestmark = pytest.mark.engine


def reset_peak() -> int:
    """Start a new peak at the resident memory now (Linux, since 4.0): that memory, in bytes."""
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")
    return psutil.Process().memory_info().rss


def peak_since(start: int) -> int:
    with open("/proc/self/status") as file:
        return int(re.search(r"VmHWM:\s+(\d+) kB", file.read()).group(1)) * 1024 - start


def load_and_save(rank: int, world_size: int, folder: str, port: int, results: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size))
    process = ranks.start(use_gpu=False)
    options = fine_tune.Options(base_model=folder, lora_rank=0)
    built_on = []

    def build():
        model = fine_tune.build_model({}, options)
        built_on.append(next(model.parameters()).device.type)
        return model

    try:
        build_one(os.environ["SMALL_MODEL"])  # unmeasured: the libraries' own first-use memory is not the model's
        gc.collect()
        start = reset_peak()
        alone = build_one(folder)  # the baseline: one from_pretrained in one process, every weight read once (its
        sum(parameter.sum() for parameter in alone.parameters())  # file's pages are mapped, resident once read)
        peaks = {"from_pretrained": peak_since(start)}
        del alone
        gc.collect()

        start = reset_peak()
        model = ranks.built_on_main(process, build)
        peaks["built_on_main"] = peak_since(start)
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        weights = model.state_dict()
        del model
        gc.collect()

        built_on.clear()
        start = reset_peak()
        strategy = FullyShardedDataParallel(process, "fp32", grad_clip=0.0)
        strategy.prepare(strategy.build(build), sgd, lambda step: 1.0)
        peaks["fsdp2_load"] = peak_since(start)
        start = reset_peak()
        saved = strategy.full_state_dict()
        peaks["fsdp2_save"] = peak_since(start)
        torch.save({"peaks": peaks, "built_on": built_on, "tied": tied, "weights": weights, "saved": saved},
                   os.path.join(results, f"rank-{rank}.pt"))
    finally:
        ranks.stop(process)


def build_one(folder: str) -> torch.nn.Module:
    return fine_tune.build_model({}, fine_tune.Options(base_model=folder, lora_rank=0))


def test_no_rank_but_the_loading_one_holds_a_second_copy_of_the_model_and_fsdp2_s_others_hold_their_shards(
        tmp_path, monkeypatch):
    import transformers

    folder = str(tmp_path / "model")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=8000,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    small = str(tmp_path / "small")
    fine_tune.save_small_model(small, ["the red fox runs."] * 10)
    for name in os.listdir(small):  # the small model's tokenizer beside the larger model
        if "token" in name:
            shutil.copy(os.path.join(small, name), folder)
    monkeypatch.setenv("SMALL_MODEL", small)
    # Every large block its own mapping, unmapped when freed (glibc's threshold would otherwise rise to the largest
    # freed block and keep freed memory in the heap, where a later phase reuses it without a new peak).
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    torch.multiprocessing.spawn(load_and_save, args=(2, folder, free_port(), str(tmp_path)), nprocs=2, join=True)
    first, second = (torch.load(tmp_path / f"rank-{rank}.pt", weights_only=True) for rank in range(2))

    storages = {value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
                for value in first["weights"].values()}  # the tied embedding counted once
    model_bytes = sum(storages.values())
    print(f"\npeak resident memory growth, MB (the model: {model_bytes / 1e6:.1f} MB in float32)")
    for phase in first["peaks"]:
        print(f"  {phase:<16} rank 0 {first['peaks'][phase] / 1e6:6.1f}   rank 1 {second['peaks'][phase] / 1e6:6.1f}")
    assert model_bytes > 35e6
    # Where each rank built: rank 0 for real, once for built_on_main and once for FSDP2 (plus its meta structure)
    assert first["built_on"] == ["cpu", "meta"] and second["built_on"] == ["meta"]
    alone = first["peaks"]["from_pretrained"]
    assert 0.8 * model_bytes < alone < 2.2 * model_bytes
    # DDP's ranks: rank 0 as one from_pretrained, the other one copy (on its GPU, on a GPU node)
    assert first["peaks"]["built_on_main"] < alone + 0.3 * model_bytes
    assert 0.8 * model_bytes < second["peaks"]["built_on_main"] < 1.3 * model_bytes
    # FSDP2: rank 0 loads the model and keeps its half; the other holds its half, a tensor in flight and the group's
    # buffers (seen: 4 MB), never the whole model
    largest_tensor = max(value.numel() * value.element_size() for value in first["weights"].values())
    assert first["peaks"]["fsdp2_load"] < alone + 0.8 * model_bytes
    assert 0.4 * model_bytes < second["peaks"]["fsdp2_load"] < 0.65 * model_bytes + largest_tensor
    # Saving: the whole model on rank 0 alone
    assert 0.8 * model_bytes < first["peaks"]["fsdp2_save"] < 1.3 * model_bytes + largest_tensor
    assert second["peaks"]["fsdp2_save"] < 0.5 * model_bytes and second["saved"] == {}  # tensors in flight
    assert first["tied"] and second["tied"]
    for rank in (first, second):  # the weights arrive whole wherever they were built
        assert rank["weights"].keys() == first["weights"].keys()
        assert all(torch.equal(rank["weights"][name], first["weights"][name]) for name in first["weights"])
    assert first["saved"].keys() == first["weights"].keys()
    assert all(torch.equal(first["saved"][name], first["weights"][name]) for name in first["weights"])
