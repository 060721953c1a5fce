"""tokens/s and MFU against a hand count: the language model's FLOPs per token from its layers' shapes, a known batch
on a known number of processes (one GPU each) over a known time, and an H100's data-sheet peak."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distributed_training.task_interface import load_task
from distributed_training.training import ranks, throughput
from distributed_training.training.throughput import StepMeter, peak_of

from support.runs import LANGUAGE

H100_SXM_DENSE_BF16_TFLOPS = 989.4  # NVIDIA H100 data sheet, BF16 Tensor Core, without sparsity


def tiny_language_model_flops_per_token() -> int:
    """The tiny preset (2 layers, width 64, context 64, 320 embedding rows), counted by hand: 6 FLOPs per weight that
    multiplies activations (PaLM, appendix B), the tied embedding once as the output head, the position embedding
    left out, plus 12 x layers x width x context for attention."""
    layers, width, context, vocabulary = 2, 64, 64, 320
    attention = (width * 3 * width + 3 * width) + (width * width + width)  # query/key/value, then the projection
    mlp = (width * 4 * width + 4 * width) + (4 * width * width + width)
    norms = 2 * (2 * width)  # two LayerNorms a block, a gain and a bias each
    weights = layers * (attention + mlp + norms) + 2 * width + vocabulary * width  # + the final norm, the embedding
    return 6 * weights + 12 * layers * width * context


def test_the_language_model_s_flops_per_token_match_a_hand_count():
    task = load_task(LANGUAGE)
    options = task.Options(model_size="tiny")
    assert task.flops_per_token(task.build_model({}, options), options) == tiny_language_model_flops_per_token()


def test_the_peak_is_the_data_sheet_s_dense_figure_by_the_driver_s_name():
    assert peak_of("NVIDIA H100 80GB HBM3").tflops == H100_SXM_DENSE_BF16_TFLOPS
    assert peak_of("Tesla T4").precision == "fp16" and peak_of("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None


class Clock:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("processes", [1, 4])
def test_tokens_per_second_and_mfu_are_the_hand_counted_figures(monkeypatch, processes):
    """Each process (one GPU) trains 8 sequences of 64 tokens an update, 10 updates in 2 s, 10 ms of each waiting
    for data: 10 x 8 x 64 x processes tokens in 2 s, and MFU = that rate x FLOPs per token / (processes x peak)."""
    clock = Clock()
    monkeypatch.setattr(throughput, "time", clock)
    # every process counted the same: a sum over the ranks is the value times the processes
    monkeypatch.setattr(ranks, "sum_over_ranks", lambda process, *values: [value * processes for value in values])
    process = SimpleNamespace(rank=0, world_size=processes, device=torch.device("cpu"))
    flops = tiny_language_model_flops_per_token()
    meter = StepMeter(process, flops, counts_tokens=True)
    meter.peak_tflops = H100_SXM_DENSE_BF16_TFLOPS  # what peak_tflops_of gives on an H100 SXM
    for _ in range(10):
        clock.now += 0.2
        # the loop's update gives the window's items over every rank; loss and examples are this rank's
        loss_sum, items = torch.tensor(8 * 64 * 2.0), torch.tensor(8 * 64 * processes, dtype=torch.float64)
        meter.add(loss_sum.double(), items, examples=8, data_seconds=0.01)
    figures, _ = meter.report()

    tokens_per_second = 10 * 8 * 64 * processes / 2.0
    assert figures["tokens_per_second"] == pytest.approx(tokens_per_second, rel=1e-12)
    assert figures["examples_per_second"] == pytest.approx(10 * 8 * processes / 2.0, rel=1e-12)
    assert figures["mfu"] == pytest.approx(tokens_per_second * flops / (processes * 989.4e12), rel=1e-12)
    assert figures["mfu"] == pytest.approx(2560 * flops / 989.4e12, rel=1e-12)  # the same per GPU at any count
    assert figures["train_loss"] == pytest.approx(2.0, rel=1e-12)
    assert figures["step_seconds"] == pytest.approx(0.2, rel=1e-12)
    assert figures["data_wait_share"] == pytest.approx(0.01 / 0.2, rel=1e-12)


def test_the_run_s_totals_leave_out_the_first_settlement_and_time_spent_paused(monkeypatch):
    """The warm-up (the first settlement) is not the run's rate, and an evaluation's seconds are no training time."""
    clock = Clock()
    monkeypatch.setattr(throughput, "time", clock)
    process = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"), distributed=False)
    meter = StepMeter(process, None, counts_tokens=False)
    clock.now += 5.0  # a slow first update: compiling, warming caches
    meter.add(torch.zeros((), dtype=torch.float64), torch.tensor(32.0, dtype=torch.float64), 32, 0.0)
    meter.report()
    for _ in range(4):
        clock.now += 0.5
        meter.add(torch.zeros((), dtype=torch.float64), torch.tensor(32.0, dtype=torch.float64), 32, 0.1)
        with meter.paused():
            clock.now += 3.0  # an evaluation
    meter.report()
    totals = meter.totals()
    assert totals["examples_per_second"] == pytest.approx(4 * 32 / 2.0, rel=1e-12)
    assert totals["step_seconds"] == pytest.approx(0.5, rel=1e-12)
    assert totals["data_wait_share"] == pytest.approx(0.2, rel=1e-12)
    assert totals["tokens_per_second"] is None and totals["mfu"] is None
