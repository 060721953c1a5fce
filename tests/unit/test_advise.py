"""`advise`: memory figures checked against hand arithmetic, and the platform's advice as properties over sweeps.

The hand arithmetic uses the accounting of `advise/memory.py` (GB = 10^9 bytes, headroom x 1.20):
bf16/fp16 with Adam = 2 (weights) + 2 (gradients) + 12 (fp32 master + two moments) = 16 bytes a parameter;
fp32 with Adam = 4 + 4 + 8 = 16 bytes a parameter; transformer activations per layer s*b*h*(34 + 5*a*s/h) bytes in
16-bit (34 with fused attention), twice that in fp32; logits s*b*V*4 bytes.
"""

import json
from dataclasses import replace

import pytest

from distributed_training.compute.catalog import Catalog, default_catalog
from distributed_training.compute.requirements import DEEPSPEED, RAY, SPARK_ML_CONNECT, TORCH_DISTRIBUTOR
from distributed_training.tooling.advise.memory import (
    HEADROOM, MLP, NAMED_MODELS, TRANSFORMER, ModelShape, Sharding, Training, estimate, mlp_params, parse_count,
)
from distributed_training.tooling.advise.plan import AdviseError, Job
from distributed_training.tooling.advise.report import render
from distributed_training.tooling.advise.search import MAX_NODES, OFFLOAD_LADDER, ON_GPU_LADDER, advise
from distributed_training.tooling.answers import check_answers, default_cpu_node_type
from distributed_training.tooling.cli import main
from distributed_training.tooling.cluster_specs import default_spark_version

GB = 1e9
GPT3 = ModelShape(175e9, TRANSFORMER, layers=96, hidden=12288, heads=96, vocab=50257)


def terms(per_gpu):
    return {term.name: term.gb for term in per_gpu.gpu}


def test_gpt2_124m_fp32_adam_fits_one_t4():
    params = 124_439_808
    weights = params * 4 / GB  # 0.4978 GB
    gradients = params * 4 / GB  # 0.4978 GB
    adam = params * 8 / GB  # m and v in fp32: 0.9955 GB
    per_layer_16bit = 1024 * 4 * 768 * (34 + 5 * 12 * 1024 / 768)  # 3,145,728 x 114 = 358,612,992 bytes
    activations = 12 * per_layer_16bit * 2 / GB  # fp32 doubles it: 8.6067 GB
    logits = 1024 * 4 * 50257 * 4 / GB  # 0.8234 GB
    needed = (weights + gradients + adam + activations + logits) * 1.20  # 11.4212 x 1.2 = 13.7054 GB <= 16 GB
    assert needed == pytest.approx(13.7054, abs=1e-4)

    training = Training(NAMED_MODELS["gpt2"], precision="fp32", optimizer="adam", batch_size=4, seq_len=1024)
    advice = advise(Job("azure", training))

    plan = advice.plan
    assert terms(plan.estimate) == pytest.approx(
        {"weights": weights, "gradients": gradients, "optimizer": adam, "activations": activations, "logits": logits})
    assert plan.estimate.needed_gb == pytest.approx(needed)
    # One GPU, one node, no sharding. The V100 (NCv3) has 16 GB too, but Azure retired it.
    assert (plan.node.id, plan.nodes, plan.engine) == ("Standard_NC4as_T4_v3", 1, TORCH_DISTRIBUTOR)
    assert plan.sharding == Sharding(0)
    assert advice.template_answers() == {"cloud": "azure", "engine": "torch_distributor",
                                         "node_type_id": "Standard_NC4as_T4_v3", "num_workers": "0"}


def test_opt_1_3b_bf16_adam_fits_one_48gb_gpu_on_aws():
    params = 1_315_758_080
    states = params * 16 / GB  # 2 + 2 + 12 bytes a parameter: 21.0521 GB
    activations = 24 * 2048 * 1 * 2048 * 34 / GB  # fused attention: 24 x 142,606,336 bytes = 3.4226 GB
    logits = 2048 * 1 * 50272 * 4 / GB  # 0.4118 GB
    needed = (states + activations + logits) * 1.20  # 24.8865 x 1.2 = 29.8638 GB: more than a 24 GB A10G or L4
    assert needed == pytest.approx(29.8638, abs=1e-4)
    # Even with activation checkpointing, 24 GB is not enough: the states alone need 21.05 x 1.2 = 25.26 GB.
    assert states * 1.20 > 24

    training = Training(NAMED_MODELS["opt-1.3b"], batch_size=1, seq_len=2048, flash_attention=True)
    plan = advise(Job("aws", training)).plan

    assert plan.estimate.needed_gb == pytest.approx(needed)
    assert (plan.node.id, plan.node.gpu_model, plan.nodes, plan.engine) == ("g6e.xlarge", "L40S", 1, TORCH_DISTRIBUTOR)


def test_llama_7b_bf16_adam_needs_zero3_on_two_gpus_of_one_node():
    params = 6_738_415_616
    activations = 32 * 2048 * 1 * 4096 * 34 / GB  # 9.1268 GB
    logits = 2048 * 1 * 32000 * 4 / GB  # 0.2621 GB
    one_gpu = (params * 16 / GB + activations + logits) * 1.20  # (107.8146 + 9.3889) x 1.2 = 140.64 GB > 80 GB
    zero2_on_two = (params * 2 / GB + params * 14 / GB / 2 + activations + logits) * 1.20  # 84.04 GB > 80 GB
    zero3_on_two = (params * 16 / GB / 2 + activations + logits) * 1.20  # (53.9073 + 9.3889) x 1.2 = 75.96 GB
    assert (one_gpu, zero2_on_two, zero3_on_two) == pytest.approx((140.644, 84.04, 75.955), abs=1e-2)

    training = Training(NAMED_MODELS["llama-7b"], batch_size=1, seq_len=2048, flash_attention=True)
    advice = advise(Job("gcp", training))

    assert advice.baseline.needed_gb == pytest.approx(one_gpu)
    plan = advice.plan
    assert plan.estimate.needed_gb == pytest.approx(zero3_on_two)
    assert (plan.node.id, plan.gpus, plan.nodes, plan.engine) == ("a2-ultragpu-2g", 2, 1, DEEPSPEED)
    assert plan.sharding == Sharding(3)
    assert advice.deepspeed_config() == {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    assert advice.template_answers()["num_workers"] == "0"


def test_where_zero_holds_the_job_on_the_gpus_fsdp2_does_too_with_its_own_arithmetic():
    """FSDP2 keeps fp32 weights and gradients (4 + 4) and AdamW's moments (8): 16 bytes a parameter sharded over the
    GPUs, as ZeRO 3's 2 + 2 + 12 in bf16; with activations and logits it holds llama-7b on the same two A100s."""
    params = 6_738_415_616
    fsdp2_on_two = (params * 16 / GB / 2 + 32 * 2048 * 4096 * 34 / GB + 2048 * 32000 * 4 / GB) * 1.20
    large = Training(NAMED_MODELS["llama-7b"], batch_size=1, seq_len=2048, flash_attention=True)
    advice = advise(Job("gcp", large))
    (note,) = [note for note in advice.notes if note.startswith("FSDP2 holds it too")]
    assert "engine torch_distributor with `train --parallelism fsdp2`" in note
    assert "6.738B params x 16 bytes (fp32 weights, fp32 gradients, AdamW m, v) / 2 GPUs (FSDP2) = 53.91 GB" in note
    assert f"= {fsdp2_on_two:.2f} GB <= 80 GB per GPU" in note
    fsdp2 = advice.to_dict()["fsdp2"]
    assert (fsdp2["engine"], fsdp2["train_options"]) == (TORCH_DISTRIBUTOR, ["--parallelism", "fsdp2"])
    assert fsdp2["memory_per_gpu"]["needed_gb"] == pytest.approx(fsdp2_on_two, abs=1e-3)
    assert advise(Job("gcp", large, prefer_ray=True)).to_dict()["fsdp2"]["engine"] == RAY
    # Not where DDP holds it (nothing to shard), nor where only CPU offload does (FSDP2 keeps all on the GPUs).
    assert advise(Job("aws", Training(NAMED_MODELS["gpt2"], batch_size=1))).to_dict()["fsdp2"] is None
    offloaded = advise(Job("azure", Training(NAMED_MODELS["llama-70b"], batch_size=1, seq_len=2048,
                                             flash_attention=True)))
    assert offloaded.plan.sharding.offload != "none" and offloaded.to_dict()["fsdp2"] is None


def test_llama_70b_on_nc96ads_a100_needs_five_nodes():
    params = 68_976_648_192
    checkpointed = (80 * 2 * 2048 * 8192 + 2048 * 8192 * 34) / GB  # layer inputs + one layer rebuilt: 3.2548 GB
    logits = 2048 * 32000 * 4 / GB
    on_20_gpus = (params * 16 / GB / 20 + checkpointed + logits) * 1.20  # (55.1813 + 3.5169) x 1.2 = 70.44 GB <= 80
    on_16_gpus = (params * 16 / GB / 16 + checkpointed + logits) * 1.20  # (68.9766 + 3.5169) x 1.2 = 86.99 GB > 80
    # One node cannot take it even with offload: the weights too on the CPU need 14 bytes a parameter there,
    # 965.7 GB x 1.2 = 1158.8 GB of host memory, more than the node's 880 GB.
    assert params * 14 / GB * 1.20 > 880
    assert (on_20_gpus, on_16_gpus) == pytest.approx((70.438, 86.992), abs=1e-2)

    training = Training(NAMED_MODELS["llama-70b"], batch_size=1, seq_len=2048, flash_attention=True)
    advice = advise(Job("azure", training, node_type_id="Standard_NC96ads_A100_v4"))

    plan = advice.plan
    assert (plan.nodes, plan.gpus, plan.num_workers, plan.engine) == (5, 20, 5, DEEPSPEED)
    assert plan.sharding == Sharding(3, checkpointing=True)
    assert plan.estimate.needed_gb == pytest.approx(on_20_gpus)
    assert advice.template_answers()["num_workers"] == "5"


def test_llama_70b_stays_on_one_node_with_cpu_offload_and_names_the_multi_node_alternative():
    params = 68_976_648_192
    on_gpu = (params * 4 / GB / 8 + (80 * 2 * 2048 * 8192 + 2048 * 8192 * 34) / GB + 2048 * 32000 * 4 / GB) * 1.20
    host = params * 12 / GB * 1.20  # the optimizer states of all 8 GPUs in the node's memory: 993.26 GB <= 1900 GB
    assert (on_gpu, host) == pytest.approx((45.61, 993.26), abs=1e-2)

    training = Training(NAMED_MODELS["llama-70b"], batch_size=1, seq_len=2048, flash_attention=True)
    advice = advise(Job("azure", training))

    plan = advice.plan
    assert (plan.node.id, plan.nodes) == ("Standard_ND96isr_H100_v5", 1)
    assert plan.sharding == Sharding(3, "optimizer", checkpointing=True)
    assert plan.estimate.needed_gb == pytest.approx(on_gpu)
    assert plan.estimate.host_gb * plan.node.gpus * HEADROOM == pytest.approx(host)
    assert advice.alternative.nodes > 1 and advice.alternative.sharding.offload == "none"
    assert advice.deepspeed_config()["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_mlp_on_tabular_features_counts_parameters_and_per_sample_activations():
    params = 100 * 256 + 256 + 2 * (256 * 256 + 256) + 256 + 1  # 3 hidden layers of 256, one output: 157,697
    assert mlp_params(100, 256, 3) == params
    model = ModelShape(params, MLP, layers=3, hidden=256, features=100)
    per_gpu = estimate(Training(model, precision="fp32", optimizer="sgd-momentum", batch_size=512), Sharding(), 1)
    assert terms(per_gpu) == pytest.approx({
        "weights": params * 4 / GB, "gradients": params * 4 / GB, "optimizer": params * 4 / GB,
        "activations": 512 * (100 + 2 * 3 * 256) * 4 / GB,  # 512 samples x 1636 values x 4 bytes
    })


@pytest.mark.parametrize("precision, optimizer, bytes_per_param", [
    ("bf16", "adamw", 16), ("fp16", "adam", 16), ("fp32", "adam", 16), ("bf16", "sgd-momentum", 12),
    ("bf16", "sgd", 8), ("fp32", "sgd", 8),
])
def test_bytes_per_parameter_and_zero_stages_shard_them(precision, optimizer, bytes_per_param):
    model = ModelShape(1e9, MLP, layers=1, hidden=1, features=1)
    training = Training(model, precision=precision, optimizer=optimizer, batch_size=1)
    states = lambda per_gpu: sum(gb for name, gb in terms(per_gpu).items() if name != "activations")  # noqa: E731
    assert states(estimate(training, Sharding(0), 8)) == pytest.approx(bytes_per_param)
    assert states(estimate(training, Sharding(3), 8)) == pytest.approx(bytes_per_param / 8)
    offloaded = estimate(training, Sharding(3, "optimizer+weights"), 8)
    assert set(terms(offloaded)) == {"gradients", "activations"}
    assert offloaded.host_gb + states(offloaded) == pytest.approx(bytes_per_param / 8)


def _sweep():
    models = [*NAMED_MODELS.values(), GPT3]
    for cloud in ("azure", "aws", "gcp"):
        for model in models:
            for batch_size, seq_len, flash in ((1, 2048, True), (8, 1024, False), (32, 512, True)):
                yield Job(cloud, Training(model, batch_size=batch_size, seq_len=seq_len, flash_attention=flash))


def _fits_one_node(job):
    """Brute force over every GPU node type of the cloud and every sharding, with the fit rule stated afresh."""
    for node in default_catalog().node_types:
        if node.cloud != job.cloud or not node.has_gpu or node.multi_gpu_broken or node.retired:
            continue
        for sharding in (*ON_GPU_LADDER, *OFFLOAD_LADDER):
            per_gpu = estimate(job.training, sharding, node.gpus)
            if per_gpu.needed_gb <= node.gpu_memory_gb and per_gpu.host_gb * node.gpus * 1.2 <= node.memory_gb:
                return True
    return False


def _fits_one_gpu(job):
    single_gpus = [node for node in default_catalog().node_types
                   if node.cloud == job.cloud and node.gpus == 1 and not node.retired]
    return any(estimate(job.training, Sharding(0, checkpointing=checkpointing), 1).needed_gb <= node.gpu_memory_gb
               for node in single_gpus for checkpointing in (False, True))


@pytest.mark.parametrize("job", list(_sweep()), ids=lambda job: f"{job.cloud}-{job.training.model.name or '175b'}-"
                         f"b{job.training.batch_size}")
def test_single_node_whenever_the_job_fits_on_one(job):
    advice = advise(job)
    assert advice.plan is not None, advice.why
    plan = advice.plan
    assert (plan.nodes == 1) == _fits_one_node(job)
    if _fits_one_gpu(job):
        assert plan.gpus == 1 and plan.engine == TORCH_DISTRIBUTOR
    # whatever is recommended really fits, and several nodes are never more than needed
    assert plan.estimate.needed_gb <= plan.node.gpu_memory_gb
    if plan.nodes > 2:
        fewer = estimate(job.training, plan.sharding, plan.node.gpus * (plan.nodes - 1))
        assert fewer.needed_gb > plan.node.gpu_memory_gb
    assert plan.engine == (DEEPSPEED if plan.sharding.needs_deepspeed else TORCH_DISTRIBUTOR)


def _template_errors(advice):
    answers = {"project_name": "My Training", "project_slug": "my-training", "package_name": "my_training",
               "catalog": "main", "schema": "default", "allow_unknown_node_type": "no",
               "cpu_node_type_id": default_cpu_node_type(advice.job.cloud), **advice.template_answers()}
    answers["spark_version"] = default_spark_version(answers["engine"])
    return [finding for finding in check_answers(answers) if finding.is_error]


def test_recommendations_pass_the_templates_own_guards():
    for job in _sweep():
        advice = advise(job)
        assert _template_errors(advice) == [], render(advice)


def test_azure_never_recommends_several_nc_series_nodes():
    several = [advise(job).plan for job in _sweep() if job.cloud == "azure"]
    several = [plan for plan in several if plan.nodes > 1]
    assert several, "the sweep has jobs that need several nodes"
    assert all(plan.node.multi_node != "refuse" and not plan.node.family.startswith("NCv") for plan in several)


def test_a_job_too_big_for_one_nc_series_node_is_refused_with_the_reason():
    """Databricks does not recommend multi-node training on Azure NC-series. Every NC family the catalog refuses is
    retired now, so this holds the rule against the catalog as it stood before Microsoft's NCv3 retirement."""
    catalog = default_catalog()
    before_retirement = Catalog([replace(node, retired=None) for node in catalog.node_types], catalog.defaults)
    training = Training(NAMED_MODELS["llama-70b"], batch_size=1, seq_len=2048, flash_attention=True)
    advice = advise(Job("azure", training, node_type_id="Standard_NC24s_v3"), before_retirement)
    assert advice.plan is None
    assert "low inter-node network performance" in advice.why and "accelerated networking" in advice.why
    with pytest.raises(AdviseError):
        advice.template_answers()


def test_retired_node_types_are_never_recommended_and_refused_when_named():
    """Microsoft's NCv3 retirement notice (2025-09-30) and NC24rs_v3's (2025-03-31): no cluster of them starts."""
    assert all(not advise(job).plan.node.retired for job in _sweep() if job.cloud == "azure")
    gpt2 = Training(NAMED_MODELS["gpt2"], batch_size=1)
    for node_type_id in ("Standard_NC6s_v3", "Standard_NC24rs_v3"):
        replacements = default_catalog().find(node_type_id).retired.replacements
        with pytest.raises(AdviseError, match="retired") as refused:
            advise(Job("azure", gpt2, node_type_id=node_type_id))
        assert all(replacement in str(refused.value) for replacement in replacements)


def test_ray_when_asked_for_unless_the_job_needs_deepspeed():
    small = Training(NAMED_MODELS["gpt2"], batch_size=1)
    large = Training(NAMED_MODELS["llama-7b"], batch_size=1, seq_len=2048, flash_attention=True)
    assert advise(Job("aws", small, prefer_ray=True)).plan.engine == RAY
    advice = advise(Job("aws", large, prefer_ray=True))
    assert advice.plan.engine == DEEPSPEED
    assert any("Ray Train was asked for" in note for note in advice.notes)


def test_classical_models_use_spark_ml_on_cpu_nodes_one_node_while_the_data_fits():
    small = advise(Job("gcp", None, dataset_gb=5)).plan
    # 5 GB on disk x 2 in memory = 10 GB; the smallest node with 10 GB usable (half its memory) has 32 GB
    assert (small.engine, small.node.id, small.nodes) == (SPARK_ML_CONNECT, "n2-standard-8", 1)
    assert not small.node.has_gpu
    large = advise(Job("aws", None, dataset_gb=500)).plan
    # 500 x 2 = 1000 GB in memory; the largest AWS CPU node (m5d.4xlarge, 64 GB) offers 32 GB: ceil(1000 / 32) = 32
    assert (large.node.id, large.num_workers) == ("m5d.4xlarge", 32)


def test_data_that_outgrows_node_memory_is_streamed_not_a_reason_for_more_gpus():
    training = Training(NAMED_MODELS["gpt2"], batch_size=1)
    advice = advise(Job("aws", training, dataset_gb=2000))
    assert advice.plan.gpus == 1
    assert any("streams from storage" in note and "does not call for more GPUs" in note for note in advice.notes)
    cached = advise(Job("aws", training, dataset_gb=1))
    assert any("cache it" in note for note in cached.notes)


def test_parameter_counts_in_every_notation():
    assert [parse_count(text) for text in ("124000000", "1.3e9", "1.3B", "350M", "70b", "1.5T")] == \
        [124e6, 1.3e9, 1.3e9, 350e6, 70e9, 1.5e12]
    for bad in ("-5", "0", "seven", "1e400", "3X"):
        with pytest.raises(ValueError):
            parse_count(bad)


# ---------------------------------------------------------------- the command line, in process

def test_cli_shows_the_arithmetic_and_the_template_answers(capsys):
    code = main(["advise", "--model", "llama-7b", "--batch-size", "1", "--seq-len", "2048", "--flash-attention",
                 "--cloud", "gcp", "--dataset-gb", "50"])
    out = capsys.readouterr().out
    assert code == 0
    optimizer_line = next(line for line in out.splitlines() if "/ 2 GPUs (ZeRO-3)" in line and "optimizer" in line)
    assert "6.738B params x 12 bytes (fp32 master + AdamW m, v) / 2 GPUs (ZeRO-3)" in optimizer_line
    assert optimizer_line.split("=")[-1].strip() == "40.43 GB"  # 6.738415616e9 x 12 / 2 / 10^9
    assert "= 75.96 GB <= 80 GB on each A100" in out
    assert "Template answers: cloud=gcp engine=deepspeed node_type_id=a2-ultragpu-2g num_workers=0" in out


def test_cli_template_answers_and_json(capsys):
    assert main(["advise", "--params", "124M", "--layers", "12", "--hidden", "768", "--heads", "12",
                 "--cloud", "aws", "--template-answers"]) == 0
    assert capsys.readouterr().out == "cloud=aws engine=torch_distributor node_type_id=g4dn.xlarge num_workers=0\n"
    assert main(["advise", "--model-type", "classical", "--dataset-gb", "500", "--cloud", "aws", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recommendation"]["engine"] == SPARK_ML_CONNECT
    assert result["template_answers"]["num_workers"] == "32"


def test_cli_says_when_nothing_fits_with_exit_code_1(capsys):
    code = main(["advise", "--model", "llama-70b", "--cloud", "aws", "--node-type", "g4dn.xlarge"])
    out = capsys.readouterr().out
    assert code == 1
    assert "Does not fit:" in out and f"not even {MAX_NODES} nodes with CPU offload" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt3", "--cloud", "aws"], "invalid choice: 'gpt3'"),
    (["--model", "gpt2", "--cloud", "mars"], "invalid choice: 'mars'"),
    (["--params=-5", "--cloud", "aws"], "at least 1 parameter"),
    (["--model", "gpt2", "--cloud", "aws", "--dataset-gb=-1"], "must be above 0"),
    (["--model", "gpt2", "--cloud", "aws", "--batch-size", "0"], "must be 1 or more"),
])
def test_cli_rejects_bad_values_through_argparse(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["advise", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--params", "1.3e9", "--cloud", "aws"], "missing --layers, --hidden, --heads"),
    (["--model", "gpt2", "--layers", "4", "--cloud", "aws"], "drop --layers"),
    (["--model", "gpt2", "--cloud", "aws", "--node-type", "g5.12xlarg"], "did you mean g5.12xlarge"),
    (["--model", "gpt2", "--cloud", "aws", "--node-type", "Standard_NC4as_T4_v3"], "give --cloud azure"),
    (["--model", "gpt2", "--cloud", "aws", "--node-type", "m5d.xlarge"], "has no GPU"),
    (["--model", "gpt2", "--cloud", "azure", "--node-type", "Standard_NC24s_v3"],
     "retired on 2025-09-30: use Standard_NC24ads_A100_v4"),
    (["--model-type", "classical", "--cloud", "aws"], "give --dataset-gb"),
    (["--model-type", "mlp", "--features", "10", "--cloud", "aws"], "missing --layers, --hidden"),
])
def test_cli_rejects_questions_it_cannot_answer_with_the_reason(argv, message, capsys):
    assert main(["advise", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("advise: error:") and message in error
