"""`advise`: memory figures checked against hand arithmetic, and the platform's advice as properties over sweeps.

The hand arithmetic uses the accounting of `advise/memory.py` (GB = 10^9 bytes, headroom x 1.20):
bf16/fp16 with Adam = 2 (weights) + 2 (gradients) + 12 (fp32 master + two moments) = 16 bytes a parameter;
fp32 with Adam = 4 + 4 + 8 = 16 bytes a parameter; transformer activations per layer s*b*h*(34 + 5*a*s/h) bytes in
16-bit (34 with fused attention), twice that in fp32; logits s*b*V*4 bytes. Fine-tuning in full: the same terms;
with LoRA: the frozen base's 2 bytes a parameter in bf16, and r*(in + out) adapter parameters for each of a Llama
layer's q, k, v, o, gate, up and down projections, each with 4 + 4 + 8 bytes (fp32 weights, gradients, AdamW's m, v).
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


# ---------------------------------------------------------------- fine-tuning a pretrained Llama: full and LoRA

# Each config.json on huggingface.co/meta-llama: (num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings).
LLAMA_CONFIGS = {
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, 128256, True),
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, 128256, False),
    "llama-3.1-70b": (80, 8192, 64, 8, 28672, 128256, False),
    "llama-7b": (32, 4096, 32, 32, 11008, 32000, False),  # Llama-2-7b-hf
    "llama-13b": (40, 5120, 40, 40, 13824, 32000, False),  # Llama-2-13b-hf
    "llama-70b": (80, 8192, 64, 8, 28672, 32000, False),  # Llama-2-70b-hf
}
LLAMA_3 = ("llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b")
# What peft counts (get_peft_model with LoraConfig(r=16, target_modules=[q, k, v, o, gate, up, down]_proj) on
# transformers' LlamaForCausalLM built from each config on the meta device, then the trainable parameters).
PEFT_RANK_16 = {"llama-3.2-1b": 11_272_192, "llama-3.1-8b": 41_943_040, "llama-3.1-70b": 207_093_760}


def _projections(name):
    """Each decoder layer's (in, out) of q, k, v, o, gate, up, down."""
    _, hidden, heads, kv_heads, intermediate, _, _ = LLAMA_CONFIGS[name]
    kv = kv_heads * hidden // heads
    return [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, intermediate),
            (hidden, intermediate), (intermediate, hidden)]


def _lora_params(name, rank=16):
    return LLAMA_CONFIGS[name][0] * sum(rank * (inputs + outputs) for inputs, outputs in _projections(name))


@pytest.mark.parametrize("name", LLAMA_CONFIGS)
def test_the_llamas_have_their_configs_shapes_and_parameter_counts(name):
    layers, hidden, heads, kv_heads, intermediate, vocab, tied = LLAMA_CONFIGS[name]
    model = NAMED_MODELS[name]
    assert (model.layers, model.hidden, model.heads, model.kv_heads, model.intermediate, model.vocab) == \
        (layers, hidden, heads, kv_heads, intermediate, vocab)
    per_layer = sum(inputs * outputs for inputs, outputs in _projections(name)) + 2 * hidden  # and two RMSNorms
    embeddings = vocab * hidden * (1 if tied else 2)  # the output layer shares the embedding's weights when tied
    assert model.params == layers * per_layer + embeddings + hidden  # and the final norm


@pytest.mark.parametrize("name", LLAMA_3)
def test_lora_adapters_are_rank_times_in_plus_out_of_each_projection(name):
    assert _lora_params(name) == PEFT_RANK_16[name]
    model = NAMED_MODELS[name]
    assert Training(model, fine_tune="lora").adapter_params == PEFT_RANK_16[name]
    assert Training(model, fine_tune="lora", lora_rank=64).adapter_params == 4 * PEFT_RANK_16[name]
    assert Training(model, fine_tune="full").adapter_params is None


SEQ = 2048  # micro-batch 1, fused attention, bf16, AdamW
LOGITS = SEQ * 128256 * 4 / GB  # 1.0507 GB


def _fine_tuning(name, fine_tune):
    return Training(NAMED_MODELS[name], batch_size=1, seq_len=SEQ, flash_attention=True, fine_tune=fine_tune)


def _activations(name, checkpointing):
    """34*s*b*h bytes a layer with fused attention; checkpointed, each layer's 2*s*b*h input and one layer rebuilt."""
    layers, hidden = LLAMA_CONFIGS[name][:2]
    return (layers * 2 * SEQ * hidden + SEQ * hidden * 34 if checkpointing else layers * SEQ * hidden * 34) / GB


def _expected_terms(name, fine_tune, share, checkpointing):
    """bf16 with AdamW. Full: 2 + 2 + 12 bytes a parameter. LoRA: the frozen base's 2 bytes, the adapter's fp32
    weights (4), gradients (4) and moments (8). ZeRO 3 divides each by the GPUs (`share`)."""
    params = NAMED_MODELS[name].params
    if fine_tune == "full":
        states = {"weights": params * 2, "gradients": params * 2, "optimizer": params * 12}
    else:
        adapter = _lora_params(name)
        states = {"frozen base": params * 2, "adapter weights": adapter * 4, "adapter gradients": adapter * 4,
                  "adapter optimizer": adapter * 8}
    return {**{term: size / share / GB for term, size in states.items()},
            "activations": _activations(name, checkpointing), "logits": LOGITS}


@pytest.mark.parametrize("name, fine_tune, node_type, sharding, needed", [
    # 2.47 + 3 x 0.045 (adapter) + 2.28 + 1.05 = 5.98 GB x 1.2: one GPU (the A100s' family before the L4s')
    ("llama-3.2-1b", "lora", "a2-highgpu-1g", Sharding(0), 7.18),
    # 1.236B x 16 bytes = 19.77 + 2.28 + 1.05 = 23.11 GB x 1.2: one 40 GB A100
    ("llama-3.2-1b", "full", "a2-highgpu-1g", Sharding(0), 27.73),
    # 16.06 (frozen base) + 0.67 (adapter) + 9.13 + 1.05 = 26.91 GB x 1.2: one 40 GB A100, no sharding
    ("llama-3.1-8b", "lora", "a2-highgpu-1g", Sharding(0), 32.29),
    # 8.03B x 16 / 2 = 64.24 + 0.82 (checkpointed) + 1.05 = 66.11 GB x 1.2 <= 80: ZeRO 3 over two 80 GB A100s
    ("llama-3.1-8b", "full", "a2-ultragpu-2g", Sharding(3, checkpointing=True), 79.34),
    # 141.11 / 4 = 35.28 (frozen base) + 3.31 / 4 (adapter) + 3.25 (checkpointed) + 1.05 = 40.41 GB x 1.2
    ("llama-3.1-70b", "lora", "a2-ultragpu-4g", Sharding(3, checkpointing=True), 48.49),
])
def test_fine_tuning_terms_and_the_setup_they_choose(name, fine_tune, node_type, sharding, needed):
    advice = advise(Job("gcp", _fine_tuning(name, fine_tune)))
    plan = advice.plan
    expected = _expected_terms(name, fine_tune, plan.gpus if sharding.zero_stage == 3 else 1, sharding.checkpointing)
    assert terms(plan.estimate) == pytest.approx(expected)
    assert plan.estimate.needed_gb == pytest.approx(sum(expected.values()) * 1.2)
    assert plan.estimate.needed_gb == pytest.approx(needed, abs=5e-3)
    assert (plan.node.id, plan.nodes, plan.sharding) == (node_type, 1, sharding)
    assert plan.engine == (DEEPSPEED if sharding.zero_stage else TORCH_DISTRIBUTOR)
    baseline = _expected_terms(name, fine_tune, 1, False)
    assert terms(advice.baseline) == pytest.approx(baseline)


def test_8b_full_and_70b_lora_need_zero3_and_no_fewer_gpus():
    """Why the search goes past one GPU, and past ZeRO 3 on fewer GPUs or without checkpointing."""
    full_8b = sum(_expected_terms("llama-3.1-8b", "full", 1, False).values()) * 1.2
    full_8b_on_two = sum(_expected_terms("llama-3.1-8b", "full", 2, False).values()) * 1.2
    lora_70b_on_two = sum(_expected_terms("llama-3.1-70b", "lora", 2, True).values()) * 1.2
    lora_70b_on_four = sum(_expected_terms("llama-3.1-70b", "lora", 4, False).values()) * 1.2
    assert (full_8b, full_8b_on_two, lora_70b_on_two, lora_70b_on_four) == \
        pytest.approx((166.39, 89.31, 91.82, 99.35), abs=1e-2)
    assert min(full_8b_on_two, lora_70b_on_two, lora_70b_on_four) > 80


def test_fsdp2_holds_70b_lora_with_the_frozen_base_and_the_adapter_sharded():
    params, adapter = NAMED_MODELS["llama-3.1-70b"].params, _lora_params("llama-3.1-70b")
    on_four = (params * 2 / 4 + adapter * 16 / 4) / GB + _activations("llama-3.1-70b", True) + LOGITS
    advice = advise(Job("gcp", _fine_tuning("llama-3.1-70b", "lora")))
    fsdp2 = advice.to_dict()["fsdp2"]["memory_per_gpu"]
    assert {term["name"]: term["gb"] for term in fsdp2["gpu"]} == pytest.approx(
        {"frozen base": params * 2 / 4 / GB, "adapter state": adapter * 16 / 4 / GB,
         "activations": _activations("llama-3.1-70b", True), "logits": LOGITS}, abs=1e-4)
    assert fsdp2["needed_gb"] == pytest.approx(on_four * 1.2, abs=1e-3)
    (note,) = [note for note in advice.notes if note.startswith("FSDP2 holds it too")]
    assert "frozen base 70.55B params x 2 bytes (bf16, frozen) / 4 GPUs (FSDP2) = 35.28 GB" in note


def test_70b_full_fine_tuning_needs_cpu_offload_on_one_node_or_three_nodes():
    params = NAMED_MODELS["llama-3.1-70b"].params
    on_gpu = (params * 2 / 8 + params * 2 / 8) / GB + _activations("llama-3.1-70b", True) + LOGITS  # 39.58 GB
    host_per_gpu = params * 12 / 8 / GB  # the fp32 master and moments: 105.83 GB, 1,015.97 GB a node with headroom
    on_16 = params * 16 / 16 / GB + _activations("llama-3.1-70b", True) + LOGITS  # 74.86 GB x 1.2 > 80: 2 nodes fail
    on_24 = params * 16 / 24 / GB + _activations("llama-3.1-70b", True) + LOGITS  # 51.34 GB x 1.2 <= 80
    assert (on_gpu * 1.2, host_per_gpu * 8 * 1.2, on_16 * 1.2, on_24 * 1.2) == \
        pytest.approx((47.50, 1015.97, 89.83, 61.61), abs=1e-2)

    advice = advise(Job("gcp", _fine_tuning("llama-3.1-70b", "full")))
    plan = advice.plan
    assert (plan.node.id, plan.nodes, plan.engine) == ("a2-ultragpu-8g", 1, DEEPSPEED)
    assert plan.sharding == Sharding(3, "optimizer", checkpointing=True)
    assert plan.estimate.needed_gb == pytest.approx(on_gpu * 1.2)
    assert plan.estimate.host_gb == pytest.approx(host_per_gpu)
    alternative = advice.alternative
    assert (alternative.node.gpus, alternative.nodes, alternative.sharding) == (8, 3, Sharding(3, checkpointing=True))
    assert alternative.estimate.needed_gb == pytest.approx(on_24 * 1.2)


@pytest.mark.parametrize("name, fine_tune, sharding, needed", [
    ("llama-3.1-8b", "lora", Sharding(0), 32.29),  # DDP: each GPU holds the whole 16.06 GB base
    ("llama-3.1-8b", "full", Sharding(3), 31.49),  # 128.49 / 8 + 9.13 + 1.05 = 26.24 GB x 1.2
    ("llama-3.1-70b", "lora", Sharding(3), 77.68),  # 141.11 / 8 + 3.31 / 8 + 45.63 + 1.05 = 64.73 GB x 1.2
])
def test_on_one_node_of_eight_80gb_gpus(name, fine_tune, sharding, needed):
    advice = advise(Job("gcp", _fine_tuning(name, fine_tune), node_type_id="a3-highgpu-8g"))
    plan = advice.plan
    expected = _expected_terms(name, fine_tune, 8 if sharding.zero_stage else 1, sharding.checkpointing)
    assert terms(plan.estimate) == pytest.approx(expected)
    assert plan.estimate.needed_gb == pytest.approx(needed, abs=5e-3)
    assert (plan.gpus, plan.nodes, plan.sharding) == (8, 1, sharding)
    assert advice.template_answers()["engine"] == (DEEPSPEED if sharding.zero_stage else TORCH_DISTRIBUTOR)


def _fine_tuning_sweep():
    for cloud in ("azure", "aws", "gcp"):
        for name in LLAMA_CONFIGS:
            for fine_tune in ("full", "lora"):
                for batch_size, seq_len, flash in ((1, 2048, True), (8, 1024, False)):
                    yield Job(cloud, Training(NAMED_MODELS[name], batch_size=batch_size, seq_len=seq_len,
                                              flash_attention=flash, fine_tune=fine_tune))


def test_fine_tuning_runs_under_ddp_or_zero3_and_its_plans_fit_and_generate():
    for job in _fine_tuning_sweep():
        advice = advise(job)
        plans = [plan for plan in (advice.plan, advice.alternative) if plan is not None]
        assert plans, advice.why
        assert all(plan.sharding.zero_stage in (0, 3) for plan in plans), render(advice)
        assert advice.serverless is None or advice.serverless.sharding.zero_stage in (0, 3)
        assert all(plan.estimate.needed_gb <= plan.node.gpu_memory_gb for plan in plans)
        assert _template_errors(advice) == [], render(advice)


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


def test_cli_fine_tunes_with_lora_and_shows_the_adapter_count_and_terms(capsys):
    code = main(["advise", "--model", "Llama-3.1-8B", "--fine-tune", "lora", "--lora-rank", "64", "--batch-size",
                 "1", "--seq-len", "2048", "--flash-attention", "--cloud", "gcp", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    adapter = _lora_params("llama-3.1-8b", rank=64)  # 4 x 41,943,040 = 167,772,160
    assert result["job"]["adapter_params"] == adapter == 167_772_160
    assert (result["job"]["model"], result["job"]["fine_tune"], result["job"]["lora_rank"]) == \
        ("llama-3.1-8b", "lora", 64)
    baseline = {term["name"]: term["gb"] for term in result["baseline_one_gpu"]["gpu"]}
    assert baseline["adapter optimizer"] == pytest.approx(adapter * 8 / GB, abs=1e-4)  # 1.3422 GB
    assert baseline["frozen base"] == pytest.approx(8_030_261_248 * 2 / GB, abs=1e-4)

    assert main(["advise", "--model", "llama-3.1-8b", "--fine-tune", "lora", "--batch-size", "1", "--seq-len",
                 "2048", "--flash-attention", "--cloud", "gcp"]) == 0
    out = capsys.readouterr().out
    assert ("adapter parameters: 32 layers x rank 16 x (9 x 4096 + 2 x 1024 + 3 x 14336) = 41,943,040 (0.52% of "
            "the base)") in out
    frozen = next(line for line in out.splitlines() if line.strip().startswith("frozen base"))
    assert "8.03B params x 2 bytes (bf16, frozen)" in frozen and frozen.split("=")[-1].strip() == "16.06 GB"
    assert "Template answers: cloud=gcp engine=torch_distributor node_type_id=a2-highgpu-1g num_workers=0" in out


def test_cli_lora_on_a_shape_given_by_flags_counts_the_same_adapters(capsys):
    shape = ["--params", "8.03B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
             "--intermediate", "14336", "--vocab", "128256"]
    assert main(["advise", *shape, "--fine-tune", "lora", "--cloud", "aws", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["adapter_params"] == PEFT_RANK_16["llama-3.1-8b"]


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
    (["--model", "gpt2", "--fine-tune", "lora", "--cloud", "aws"], "gpt2 is not Llama-shaped"),
    (["--params", "1e9", "--layers", "12", "--hidden", "768", "--heads", "12", "--fine-tune", "lora", "--cloud",
      "aws"], "give its MLP width with --intermediate"),
    (["--model", "llama-3.1-8b", "--lora-rank", "8", "--cloud", "aws"], "add --fine-tune lora or drop it"),
    (["--model", "llama-3.1-8b", "--intermediate", "8192", "--cloud", "aws"], "drop --intermediate"),
    (["--params", "1e9", "--layers", "12", "--hidden", "768", "--heads", "12", "--kv-heads", "5", "--cloud", "aws"],
     "--kv-heads 5 must divide --heads 12"),
    (["--model-type", "mlp", "--features", "10", "--layers", "2", "--hidden", "8", "--fine-tune", "full", "--cloud",
      "aws"], "--fine-tune describes transformers; drop it for --model-type mlp"),
    (["--model-type", "classical", "--fine-tune", "full", "--dataset-gb", "1", "--cloud", "aws"],
     "a classical model needs only --dataset-gb"),
])
def test_cli_rejects_questions_it_cannot_answer_with_the_reason(argv, message, capsys):
    assert main(["advise", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("advise: error:") and message in error
