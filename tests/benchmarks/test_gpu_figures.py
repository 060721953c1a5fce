"""The GPU check's arithmetic: the peak of a GPU by its exact name, and MFU from the transformer's FLOPs."""

from __future__ import annotations

import pytest
import torch

from distributed_training.tasks.causal_lm import GPT, PRESETS, Options, flops_per_token
from distributed_training.training.throughput import mfu, peak_of


@pytest.mark.parametrize("name, model, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0),
    ("NVIDIA H200", "H200 SXM", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.0),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 312.0),
    ("NVIDIA A10", "A10", 125.0),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA L40", "L40", 181.05),
    ("NVIDIA L40S", "L40S", 362.05),
    ("  nvidia   l4 ", "L4", 121.0),  # the driver's spacing and case do not matter
])
def test_a_gpu_s_peak_is_looked_up_by_its_whole_name(name, model, tflops):
    peak = peak_of(name)
    assert (peak.model, peak.tflops, peak.precision) == (model, tflops, "bf16")


def test_names_that_contain_another_gpu_s_name_are_not_taken_for_it():
    assert peak_of("NVIDIA L40").model == "L40" and peak_of("NVIDIA L40S").model == "L40S"
    assert peak_of("NVIDIA H200 NVL").tflops == 835.0 != peak_of("NVIDIA H200").tflops
    assert peak_of("NVIDIA A10G").model == "A10G" and peak_of("NVIDIA A10").model == "A10"


def test_a_gpu_without_bfloat16_or_without_a_published_figure_says_so():
    t4 = peak_of("Tesla T4")
    assert (t4.precision, t4.tflops) == ("fp16", 65.0)
    a10g = peak_of("NVIDIA A10G")
    assert a10g.tflops is None and "no A10G data sheet" in a10g.source


@pytest.mark.parametrize("name", ["NVIDIA H100", "NVIDIA GH200 480GB", "NVIDIA L4 Ultra", "Tesla V100-SXM2-16GB", ""])
def test_an_unknown_gpu_gets_no_figure(name):
    assert peak_of(name) is None


def test_flops_per_token_are_six_per_weight_plus_attention():
    # GPT-2 small's shape with a byte vocabulary: 85,301,760 parameters in matrix multiplies, 12 layers of 768, 1024
    with torch.device("meta"):
        gpt = GPT(*PRESETS["gpt2-small"])
    assert flops_per_token(gpt, Options(model_size="gpt2-small")) == 6 * 85_301_760 + 12 * 12 * 768 * 1024 == 625_056_768


def test_mfu_is_the_model_s_flops_over_the_gpus_summed_peak():
    # 500,000 tokens/s x 625,056,768 FLOPs = 312.5 TFLOP/s, of one H200's 989.4
    assert mfu(500_000, 625_056_768, gpus=1, peak_tflops=989.4) == pytest.approx(0.31587, abs=1e-5)
    assert mfu(4_000_000, 625_056_768, gpus=8, peak_tflops=989.4) == pytest.approx(0.31587, abs=1e-5)
    assert mfu(1000, 6e9, gpus=2, peak_tflops=3.0) == pytest.approx(1.0)
