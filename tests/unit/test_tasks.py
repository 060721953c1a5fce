"""The two built-in tasks through their seam: each half imports without the other's library, the Spark half prepares
a table as the ranks read it, the torch half states its loss against the trivial predictor on the same rows."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from distributed_training.task_interface import REQUIRED, TaskError, check_metrics, load_task

from distributed_training.tasks.causal_lm import VOCAB_SIZE

from support.runs import FARE, LANGUAGE

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SOURCE = Path(__file__).resolve().parents[2] / "src"
TASKS = (FARE, LANGUAGE)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("blocked", ["without_torch", "without_spark"])
def test_each_half_of_a_task_imports_without_the_other_half_s_library(task, blocked):
    """The serverless stage task has Spark and no torch; a serverless GPU node has torch and no Spark."""
    check = f"import {task} as task; print(sorted(name for name in {list(REQUIRED)!r} if hasattr(task, name)))"
    environment = {**os.environ, "PYTHONPATH": f"{SUPPORT / blocked}{os.pathsep}{SOURCE}"}
    completed = subprocess.run([sys.executable, "-c", check], env=environment, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == str(sorted(REQUIRED))
    blocker = "torch" if blocked == "without_torch" else "pyspark"
    proof = subprocess.run([sys.executable, "-c", f"import {blocker}"], env=environment, capture_output=True)
    assert proof.returncode != 0  # the blocker does block


@pytest.mark.parametrize("task_name", TASKS)
def test_the_spark_half_prepares_the_sample_table_and_its_statistics(spark, task_name):
    task = load_task(task_name)
    options = task.Options()
    table = task.sample_table(spark, seed=3)
    prepared = task.prepare(table, options)
    stats = task.statistics(prepared, options)
    rows = prepared.count()
    assert 0 < rows <= table.count()
    if task_name == FARE:
        assert rows < table.count()  # the sample's nonsense rows (refunds, clocks running backwards) are dropped
        assert set(prepared.columns) == {*task.FEATURES, task.LABEL}
        assert 5 < stats[task.LABEL]["mean"] < 50 and stats[task.LABEL]["std"] > 1
    else:
        assert prepared.columns == ["text"]
        texts = [row.text for row in prepared.collect()]
        assert stats["documents"] == rows and stats["tokens"] == sum(len(t.encode()) + 1 for t in texts)


@pytest.mark.parametrize("task_name, column", [(FARE, "fare_amount"), (LANGUAGE, "o_comment")])
def test_a_table_without_the_task_s_column_is_refused_by_name(spark, task_name, column):
    task = load_task(task_name)
    table = task.sample_table(spark, seed=3).drop(column)
    with pytest.raises(ValueError, match=column):
        task.prepare(table, task.Options())


def rows_of(spark, task, count=300):
    prepared = task.prepare(task.sample_table(spark, seed=5), task.Options()).limit(count)
    return pa.Table.from_pandas(prepared.toPandas(), preserve_index=False), task.statistics(prepared, task.Options())


def test_the_fare_baseline_is_predicting_the_training_mean(spark):
    task = load_task(FARE)
    rows, stats = rows_of(spark, task)
    features, fares = task.examples(rows, stats, task.Options())
    assert features.shape == (rows.num_rows, len(task.FEATURES)) and fares.shape == (rows.num_rows,)
    model = task.build_model(stats, task.Options())
    sums = task.evaluate(model, (features, fares), stats)
    metrics = check_metrics(task.summarize(sums, stats), FARE)
    dollars = torch.tensor(rows.column("fare_amount").to_numpy())
    mean = stats["fare_amount"]["mean"]
    assert metrics["baseline_rmse"] == pytest.approx(float(((dollars - mean) ** 2).mean().sqrt()), rel=1e-4)
    assert metrics["baseline_loss"] == pytest.approx(metrics["baseline_rmse"] ** 2 / stats["fare_amount"]["std"] ** 2)
    predictor, example = task.exported_model(model, stats, (features, fares))
    raw = torch.from_numpy(example)
    assert torch.allclose(predictor(raw), model(features[:5]) * stats["fare_amount"]["std"] + mean, atol=1e-4)


def test_the_language_model_baseline_is_the_unigram_model_on_the_same_tokens(spark):
    task = load_task(LANGUAGE)
    rows, stats = rows_of(spark, task)
    stream = task.tokenize(rows.to_pandas(), task.Options())
    (blocks,) = task.examples(stream, stats, task.Options())
    context = task.PRESETS["tiny"][3]
    assert blocks.shape[1] == context + 1 and blocks.dtype == torch.uint16 and stream.dtype == np.uint16
    assert np.shares_memory(blocks.numpy(), stream)  # cut without a copy
    texts = rows.column("text").to_pylist()
    assert bytes(stream[:len(texts[0].encode())].astype(np.uint8)) == texts[0].encode()  # the documents, in order
    assert (stream == task.END_OF_TEXT).sum() == rows.num_rows and stream.max() == task.END_OF_TEXT
    assert len(stream) == sum(len(text.encode()) + 1 for text in texts)

    model = task.build_model(stats, task.Options())
    metrics = task.summarize(task.evaluate(model, (blocks,), stats), stats)
    counts = torch.tensor(stats["token_counts"], dtype=torch.float64) + 1
    by_hand = -(counts / counts.sum()).log()[blocks[:, 1:].long()].mean()
    assert metrics["baseline_loss"] == pytest.approx(float(by_hand), rel=1e-6)
    assert metrics["held_out_loss"] == pytest.approx(math.log(task.VOCAB_SIZE), rel=0.05)  # an untrained model
    exported, example = task.exported_model(model, stats, (blocks,))
    assert exported(torch.from_numpy(example)).shape == (2, 16, task.VOCAB_SIZE)


def test_too_little_text_for_one_block_says_what_to_do():
    task = load_task(LANGUAGE)
    with pytest.raises(ValueError, match="fewer than one block of 65.*smaller --model-size"):
        task.examples(task.tokenize({"text": ["a few words"]}, task.Options()), {}, task.Options())
    (blocks,) = task.examples(task.tokenize({"text": []}, task.Options()), {}, task.Options())
    assert blocks.shape == (0, 65)  # a rank's empty held-out share


def test_a_task_without_save_pretrained_writes_no_hugging_face_folder(tmp_path):
    for name in TASKS:  # the from-scratch tasks have no Hugging Face form: the default does nothing
        task = load_task(name)
        assert task.lacks(("save_pretrained",)) == ["save_pretrained"]
        task.save_pretrained(torch.nn.Linear(2, 1), str(tmp_path / "hf_model"), task.Options())
    assert list(tmp_path.iterdir()) == []


def test_a_module_without_the_seam_is_refused_with_what_it_lacks():
    with pytest.raises(TaskError, match="lacks DEFAULT_TABLE"):
        load_task("distributed_training.files")
    with pytest.raises(TaskError, match="no task module 'nowhere.task'"):
        load_task("nowhere.task")


def padded_head_logits(model, tokens):
    """The built-in model's logits as it computed them before: the tied head over the padded vocabulary, sliced."""
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(tokens.shape[1]))
    for block in model.blocks:
        x = block(x)
    return torch.nn.functional.linear(model.final_norm(x), model.token_embedding.weight)[..., :VOCAB_SIZE]


def test_the_language_model_under_fsdp2_returns_no_view_and_keeps_its_loss_and_gradients(tmp_path):
    """FSDP2 warns of wrong gradients when its root module returns a view (torch/distributed/fsdp/_fully_shard/
    _fsdp_state.py, _register_pre_backward_hook); the logits of the vocabulary alone are no view of wider ones."""
    import warnings

    import torch.distributed as dist

    from distributed_training.training.ranks import Process
    from distributed_training.training.strategy import FullyShardedDataParallel

    task = load_task(LANGUAGE)
    torch.manual_seed(0)
    reference = task.build_model({}, task.Options())
    blocks = torch.randint(0, VOCAB_SIZE, (3, task.PRESETS["tiny"][3] + 1), dtype=torch.int32)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        sharded = FullyShardedDataParallel(Process(0, 1, 0, torch.device("cpu")), "fp32", grad_clip=0.0)
        torch.manual_seed(0)  # the reference's weights
        model = sharded.build(lambda: task.build_model({}, task.Options()))
        sharded.prepare(model, lambda module: torch.optim.SGD(module.parameters(), lr=0.1), lambda step: 1.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = task.loss(sharded.model, (blocks,))
            loss.backward()
        gradients = {name: parameter.grad.full_tensor() for name, parameter in sharded.module.named_parameters()}
    finally:
        dist.destroy_process_group()
    assert [str(warning.message) for warning in caught if "view" in str(warning.message)] == []
    targets = blocks[:, 1:].long()
    expected = torch.nn.functional.cross_entropy(padded_head_logits(reference, blocks[:, :-1].long()).flatten(0, 1),
                                                 targets.flatten())
    expected.backward()
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    expected_gradients = dict(reference.named_parameters())
    assert gradients.keys() == expected_gradients.keys()
    for name, gradient in gradients.items():
        assert torch.allclose(gradient, expected_gradients[name].grad, rtol=1e-5, atol=1e-7), name
