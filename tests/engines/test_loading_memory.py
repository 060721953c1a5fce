"""A pretrained model loaded by two ranks: rank 0 loads it, the other builds its structure on the meta device and
gets rank 0's weights on its own device (ranks.built_on_main), so a GPU node holds one copy in CPU memory, not one
per rank. Here the ranks' device is the CPU, so the other rank's copy is in CPU memory too: the test checks where
each rank built the model, that the weights arrive whole and tied, and each rank's resident memory growth (psutil)
against the model's bytes (about 10M parameters, 40 MB in float32): the loading rank's, and the other's, its one
materialised copy."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from distributed_training.tasks import fine_tune
from distributed_training.training import ranks

from support.equivalence import free_port

pytestmark = pytest.mark.engine


def load(rank: int, world_size: int, folder: str, port: int, results: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size))
    process = ranks.start(use_gpu=False)
    try:
        options = fine_tune.Options(base_model=folder, lora_rank=0)
        fine_tune.build_model({}, options)  # once untimed: the libraries' own first-use memory is not the model's
        resident = psutil.Process().memory_info().rss
        built_on = []

        def build():
            model = fine_tune.build_model({}, options)
            built_on.append(next(model.parameters()).device.type)
            return model

        model = ranks.built_on_main(process, build)
        grown = psutil.Process().memory_info().rss - resident
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        torch.save({"grown": grown, "built_on": built_on, "tied": tied, "weights": model.state_dict()},
                   os.path.join(results, f"rank-{rank}.pt"))
    finally:
        ranks.stop(process)


def test_one_rank_holds_the_pretrained_weights_in_cpu_memory_and_every_rank_gets_them(tmp_path):
    import transformers

    folder = str(tmp_path / "model")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=8000,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    fine_tune.save_small_model(str(tmp_path / "tokenizer"), ["the red fox runs."] * 10)
    for name in os.listdir(tmp_path / "tokenizer"):  # the small model's tokenizer beside the larger model
        if "token" in name:
            os.replace(tmp_path / "tokenizer" / name, tmp_path / "model" / name)
    torch.multiprocessing.spawn(load, args=(2, folder, free_port(), str(tmp_path)), nprocs=2, join=True)
    first, second = (torch.load(tmp_path / f"rank-{rank}.pt", weights_only=True) for rank in range(2))

    storages = {value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
                for value in first["weights"].values()}  # the tied embedding counted once
    model_bytes = sum(storages.values())
    assert model_bytes > 35e6
    assert first["built_on"] == ["cpu"] and second["built_on"] == ["meta"]  # the weights read on rank 0 alone
    assert 0.8 * model_bytes < first["grown"] < 1.6 * model_bytes and second["grown"] < 1.3 * model_bytes
    assert first["tied"] and second["tied"]
    assert first["weights"].keys() == second["weights"].keys()
    assert all(torch.equal(first["weights"][name], second["weights"][name]) for name in first["weights"])
