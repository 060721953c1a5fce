"""The fine-tuning task (tasks/fine_tune.py) through the real staging and loop on one process, on small pretrained
models made here (support/pretrained.py): the loss falls below the base model's, the run leaves the model in Hugging
Face format, LoRA trains only its adapters, the prompt's tokens carry no loss, the staged ids keep their width and
flags."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn import functional as F

from distributed_training.data.staged import StagedData
from distributed_training.run_folder import HF_MODEL_DIR, MODEL_FILE
from distributed_training.tasks import fine_tune
from distributed_training.training.loop import train

from support.runs import resolved_config, staged

FINE_TUNE = "distributed_training.tasks.fine_tune"
SUPERVISED = {"prompt_column": "instruction", "response_column": "response"}


def fine_tuning(output_dir, base: str, staging: str | None = None, **options):
    """A one-process run's config; with `staging`, a copy of that staged data as its own (as staging the same rows
    again would make)."""
    task_options = fine_tune.Options(base_model=base, max_length=32, **options)
    config = resolved_config(output_dir, FINE_TUNE, processes=1, epochs=1, max_steps=40, batch_size=16,
                             warmup_fraction=0.1, task_options=task_options)
    if staging:
        shutil.copytree(staging, config.staging_dir)
    return config


@pytest.fixture(scope="module")
def staged_once(spark, pretrained, tmp_path_factory):
    """`staging(data)`: the sample table's text ({}) or its prompts and responses (SUPERVISED) staged for one process,
    once a module: the folder each run copies. The Llama's tokenizer stages them; the GPT-2's is the same (both are
    trained on the same text: support/pretrained.py), so both models read the same ids."""
    assert fine_tune.tokenizer_of(pretrained("llama")).get_vocab() == \
        fine_tune.tokenizer_of(pretrained("gpt2")).get_vocab()
    folders = {}

    def staging(data: dict) -> str:
        key = tuple(sorted(data.items()))
        if key not in folders:
            config = fine_tuning(tmp_path_factory.mktemp("staged"), pretrained("llama"), **data)
            folders[key] = staged(spark, config, world_size=1, rows=1200)[0].staging_dir
        return folders[key]

    return staging


@pytest.fixture(scope="module")
def lora_run(staged_once, pretrained, tmp_path_factory):
    """A LoRA fine-tune of the Llama on the text, 6 steps with a checkpoint every 3: its config and metrics, for the
    tests that read what it wrote or start from it (none writes into its folder)."""
    config = fine_tuning(tmp_path_factory.mktemp("lora"), pretrained("llama"), staged_once({}), lora_rank=4)
    config = dataclasses.replace(config, max_steps=6, checkpoint_every_steps=3)
    return config, train(config)


@pytest.mark.parametrize("family, data, lora_rank, merge", [("llama", {}, 8, False), ("gpt2", SUPERVISED, 8, True),
                                                            ("llama", SUPERVISED, 0, False)])
def test_fine_tuning_lowers_the_held_out_loss_and_leaves_the_model_in_hugging_face_format(tmp_path, pretrained,
                                                                                          staged_once, family, data,
                                                                                          lora_rank, merge):
    config = fine_tuning(tmp_path, pretrained(family), staged_once(data), lora_rank=lora_rank, merge_adapters=merge,
                         **data)
    metrics = train(config)
    assert metrics["held_out_loss"] < 0.95 * metrics["start_held_out_loss"]  # the base model's, on the same tokens
    if not data:  # continued pre-training: the grammar beats word frequencies (responses take longer than 20 steps)
        assert metrics["held_out_loss"] < metrics["baseline_loss"]
    hugging_face_models_give_the_trained_logits(config)


def hugging_face_models_give_the_trained_logits(config):
    """The run's hf_model/ loads with transformers (and peft, for LoRA's adapters) alone, without this project's code,
    and gives the logits of the trained model (build_model with model.pt's weights) on held-out ids."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options, folder = config.task_options, os.path.join(config.output_dir, HF_MODEL_DIR)
    data = StagedData.load(config.staging_dir)
    inputs, _ = fine_tune.inputs_and_targets(fine_tune.examples(data.shard("test", 0, 1), data.stats, options))
    inputs = inputs[:4].long()
    trained = fine_tune.build_model(data.stats, options)
    trained.load_state_dict(torch.load(os.path.join(config.output_dir, MODEL_FILE), weights_only=True))

    def logits(model):
        with torch.no_grad():
            return model.eval()(input_ids=inputs).logits

    expected = logits(trained)
    assert AutoTokenizer.from_pretrained(folder)("the red fox")["input_ids"] == fine_tune.tokenizer_of(
        options.base_model)("the red fox")["input_ids"]
    if options.lora_rank == 0:
        assert {"model.safetensors", "config.json", "generation_config.json"} <= set(os.listdir(folder))
        assert float((logits(AutoModelForCausalLM.from_pretrained(folder)) - expected).abs().max()) <= 1e-6
        return
    with open(os.path.join(folder, "adapter_config.json")) as file:
        assert json.load(file)["base_model_name_or_path"] == options.base_model
    assert "model.safetensors" not in os.listdir(folder)  # the adapters alone: the base model is --base-model's
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(options.base_model), folder)
    assert float((logits(adapted) - expected).abs().max()) <= 1e-6
    merged = os.path.join(folder, fine_tune.MERGED_DIR)
    assert os.path.exists(merged) == options.merge_adapters
    if options.merge_adapters:  # W + s BA in one matrix: float32's rounding differs from W x + s B(A x)'s
        assert float((logits(AutoModelForCausalLM.from_pretrained(merged)) - expected).abs().max()) <= 1e-4
        assert AutoTokenizer.from_pretrained(merged)("the red fox")["input_ids"] == AutoTokenizer.from_pretrained(
            folder)("the red fox")["input_ids"]


def test_lora_leaves_every_base_weight_bit_for_bit_and_trains_its_adapters(lora_run):
    config, _ = lora_run
    trained = torch.load(os.path.join(config.output_dir, MODEL_FILE), weights_only=True)
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(config.task_options.base_model).state_dict()
    lora = {name: value for name, value in trained.items() if "lora_" in name}
    frozen = {name.replace("base_model.model.", "").replace(".base_layer", ""): value
              for name, value in trained.items() if "lora_" not in name}
    assert frozen.keys() == original.keys() and all(torch.equal(frozen[name], original[name]) for name in original)
    assert len(lora) == 2 * 7 * 2  # A and B of the 7 projections of 2 layers
    assert all(float(value.abs().max()) > 0 for name, value in lora.items() if "lora_B" in name)  # B starts at 0


def test_a_lora_checkpoint_holds_the_adapters_not_the_frozen_base(lora_run):
    config, _ = lora_run
    full = torch.load(os.path.join(config.output_dir, MODEL_FILE), weights_only=True)
    tags = os.listdir(config.checkpoint_dir)
    assert len(tags) == 2  # of steps 3 and 6
    for tag in tags:
        state = torch.load(os.path.join(config.checkpoint_dir, tag, "state.pt"), weights_only=True)
        assert state["model"] and all("lora_" in name for name in state["model"])
        adapter = sum(value.numel() for value in state["model"].values())
        assert adapter < 0.2 * sum(value.numel() for value in full.values())


def test_supervised_fine_tuning_counts_the_response_s_tokens_only(pretrained):
    options = fine_tune.Options(base_model=pretrained("gpt2"), max_length=24, packing="pad", **SUPERVISED)
    rows = pd.DataFrame({"prompt": ["Reverse: red fox", "Reverse: a b c"], "response": ["fox red", "c b a"]})
    (blocks,) = fine_tune.examples(fine_tune.tokenize(rows, options), {}, options)
    tokenizer = fine_tune.tokenizer_of(options.base_model)
    prompt_length = len(tokenizer("Reverse: red fox\n")["input_ids"])
    response = tokenizer("fox red", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    torch.manual_seed(0)
    model = fine_tune.build_model({}, options).eval()  # no LoRA dropout: both losses see the same network

    gradients = []
    for loss_of in (fine_tune.loss, by_hand_on(prompt_length, len(response))):
        model.zero_grad()
        loss_of(model, (blocks[:1],)).backward()
        gradients.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    assert all(torch.allclose(ours, theirs, atol=1e-7) for ours, theirs in zip(*gradients))
    assert int(fine_tune.count((blocks[:1],))) == len(response)
    # the inputs are the tokens as tokenized: the prompt, then the response (ids with the flag bit cleared)
    ids = (blocks[0] & 0x7FFF).tolist()
    assert ids[:prompt_length + len(response)] == tokenizer("Reverse: red fox\n")["input_ids"] + response


def by_hand_on(prompt_length: int, response_length: int):
    """The mean cross-entropy of the response's tokens, given everything before each."""
    def loss(model, batch):
        ids = (batch[0] & 0x7FFF).long()
        logits = model(input_ids=ids[:, :-1]).logits.float()
        predicted = slice(prompt_length - 1, prompt_length - 1 + response_length)  # position t predicts t + 1
        return F.cross_entropy(logits[0, predicted], ids[0, prompt_length:prompt_length + response_length])
    return loss


def test_a_vocabulary_past_32768_ids_is_staged_as_uint32_and_read_back_whole(spark, tmp_path, pretrained):
    from transformers import AutoTokenizer

    folder = str(tmp_path / "large-vocabulary")
    tokenizer = AutoTokenizer.from_pretrained(pretrained("llama"))
    tokenizer.add_tokens([f"w{index}" for index in range(40_000)])
    tokenizer.save_pretrained(folder)
    options = fine_tune.Options(base_model=folder, max_length=16)
    rows = pd.DataFrame({"text": [f"w39999 red fox w33000 w{index}" for index in range(120)]})
    assert fine_tune.tokenize(rows, options).dtype == np.uint32
    ids = tokenizer("w39999 red fox w33000 w0")["input_ids"]
    assert max(ids) > 1 << 15

    config = dataclasses.replace(fine_tuning(tmp_path / "run", folder), table=str(tmp_path / "table"))
    spark.createDataFrame(rows.rename(columns={"text": "o_comment"})).coalesce(1).write.parquet(config.table)
    from distributed_training.data.staging import stage
    from distributed_training.task_interface import load_task

    data = stage(spark, load_task(FINE_TUNE), config, world_size=1)
    assert data.token_dtype == "uint32"
    (blocks,) = fine_tune.examples(data.shard("train", 0, 1), data.stats, options)
    staged_ids = (blocks & 0x7FFFFFFF).flatten().tolist()
    assert blocks.dtype == torch.int32 and max(staged_ids) == max(ids) and ids[1] in staged_ids
    assert sum(data.stats["token_counts"]) == data.stats["tokens"] and data.stats["token_counts"][ids[1]] > 0


def test_a_row_s_score_is_its_mean_loss_as_an_example_of_its_own(pretrained):
    options = fine_tune.Options(base_model=pretrained("gpt2"), max_length=24, packing="pad", **SUPERVISED)
    rows = pd.DataFrame({"prompt": ["Reverse: red fox", "Reverse: a b c d"], "response": ["fox red", "d c b a"]})
    torch.manual_seed(0)
    model = fine_tune.build_model({}, options).eval()
    with torch.no_grad():
        scores = fine_tune.score(model, rows, {}, options)["nll_per_token"]
        (blocks,) = fine_tune.examples(fine_tune.tokenize(rows, options), {}, options)
        alone = [float(fine_tune.loss(model, (blocks[row:row + 1],))) for row in range(2)]
    assert scores.tolist() == pytest.approx(alone, rel=1e-5) and scores[0] != pytest.approx(scores[1])


def test_a_run_starts_from_a_lora_run_s_adapters_or_its_whole_state(tmp_path, lora_run):
    """--init-from a LoRA run, whose checkpoints hold the adapters and not the frozen base (build_model makes it
    again): --init-mode weights starts from its adapters (the new run's held-out loss before its first step is the
    earlier run's last), --init-mode full goes on from a checkpoint's whole state and ends where the earlier run did."""
    from distributed_training.training.checkpoints import tag_of

    earlier, first = lora_run
    adapters = dataclasses.replace(earlier, output_dir=str(tmp_path / "weights"), init_from=earlier.output_dir,
                                   max_steps=1)
    shutil.copytree(earlier.staging_dir, adapters.staging_dir)  # as staging the same table again: the same rows
    warm = train(adapters)
    assert warm["start_held_out_loss"] == pytest.approx(first["held_out_loss"], rel=1e-5)
    assert first["start_held_out_loss"] - first["held_out_loss"] > 0.05  # the base model's own would not pass

    onward = dataclasses.replace(earlier, output_dir=str(tmp_path / "full"), init_mode="full",
                                 init_from=os.path.join(earlier.checkpoint_dir, tag_of(3)))
    shutil.copytree(earlier.staging_dir, onward.staging_dir)
    continued = train(onward)
    assert continued["resumed_from_step"] == 3 and continued["step"] == 6
    ours, theirs = (torch.load(os.path.join(config.output_dir, MODEL_FILE), weights_only=True)
                    for config in (onward, earlier))
    assert ours.keys() == theirs.keys()
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in theirs) < 1e-6
