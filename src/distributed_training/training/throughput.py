"""How fast a run trains: tokens (or examples) per second, model FLOPs utilisation (MFU), and where a step's time goes.

One definition for the loop's progress lines, its MLflow metrics and metrics.json, and for the GPU check
(benchmarks/gpu_check.py), so the figure a user sees in MLflow is the figure the check reports:

    MFU = tokens/s x the model's training FLOPs per token / (GPUs x one GPU's dense 16-bit peak FLOP/s)

The FLOPs per token are the task's (`flops_per_token`, optional: the causal LM counts them; a task without it gets
no MFU); the peak is NVIDIA's, looked up below by the GPU's exact name (no MFU for a GPU not listed, nor on CPU).

Dense 16-bit tensor-core peaks of NVIDIA GPUs. The name is what `torch.cuda.get_device_name()` and `nvidia-smi --query-gpu=name` print (e.g. "NVIDIA H100 80GB
HBM3"), matched whole, never by substring: "NVIDIA L40" is not an L4, "NVIDIA H200 NVL" is not an H200 SXM. Figures
are NVIDIA's data-sheet figures without sparsity (the data sheets print the sparse figure, twice these). A name not
listed gets no figure: MFU is then unknown unless the caller gives a peak.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    model: str
    tflops: float | None  # dense tensor-core TFLOP/s in `precision`; None: NVIDIA publishes none
    precision: str  # "bf16", or "fp16" on GPUs without bfloat16
    source: str


def _hopper(model: str, tflops: float, sheet: str) -> Peak:
    return Peak(model, tflops, "bf16", f"NVIDIA {sheet} data sheet, BF16 Tensor Core, dense")


# Keys: the driver's names, as `normalised` leaves them.
PEAKS = {
    "h100 80gb hbm3": _hopper("H100 SXM", 989.4, "H100"),  # 1,979 with sparsity
    "h100 pcie": _hopper("H100 PCIe", 756.0, "H100"),  # 1,513 with sparsity
    "h100 nvl": _hopper("H100 NVL", 835.0, "H100"),  # 1,671 with sparsity
    "h200": _hopper("H200 SXM", 989.4, "H200"),  # 1,979 with sparsity
    "h200 nvl": _hopper("H200 NVL", 835.0, "H200"),  # 1,671 with sparsity
    **{name: Peak(f"A100 {memory}", 312.0, "bf16", "NVIDIA A100 data sheet, BF16 Tensor Core, dense")
       for name, memory in (("a100-sxm4-40gb", "40GB SXM"), ("a100-sxm4-80gb", "80GB SXM"),
                            ("a100-pcie-40gb", "40GB PCIe"), ("a100 80gb pcie", "80GB PCIe"))},
    "a10": Peak("A10", 125.0, "bf16", "NVIDIA A10 data sheet, BF16 Tensor Core, dense"),
    # AWS's variant of the A10 has no NVIDIA data sheet, and the figures others print for it disagree.
    "a10g": Peak("A10G", None, "bf16", "NVIDIA publishes no A10G data sheet; set PEAK_TFLOPS to the figure you trust"),
    "l4": Peak("L4", 121.0, "bf16", "NVIDIA L4 data sheet, BF16 Tensor Core, dense"),
    "l40": Peak("L40", 181.05, "bf16", "NVIDIA L40 data sheet, BF16 Tensor Core with FP32 accumulate, dense"),
    "l40s": Peak("L40S", 362.05, "bf16", "NVIDIA L40S data sheet, BF16 Tensor Core, dense"),
    # Turing has no bfloat16: the check trains in fp16 there, against the fp16 peak.
    "t4": Peak("T4", 65.0, "fp16", "NVIDIA T4 data sheet, mixed precision FP16/FP32 Tensor Core (no bfloat16)"),
}


def normalised(device_name: str) -> str:
    name = " ".join(device_name.split()).lower()
    for prefix in ("nvidia ", "tesla "):
        name = name.removeprefix(prefix)
    return name


def peak_of(device_name: str) -> Peak | None:
    """The GPU's peak by its exact name (case and a leading NVIDIA/Tesla aside); None for a GPU not listed."""
    return PEAKS.get(normalised(device_name))


def mfu(tokens_per_second: float, flops_per_token: float, gpus: int, peak_tflops: float) -> float:
    """The share of the GPUs' summed peak the model's FLOPs reached (0.45 = 45%)."""
    return tokens_per_second * flops_per_token / (gpus * peak_tflops * 1e12)


def peak_tflops_of(device) -> float | None:
    """The dense 16-bit peak of the GPU a torch device is, or None (a CPU, or a GPU not listed)."""
    if device.type != "cuda":
        return None
    import torch

    peak = peak_of(torch.cuda.get_device_name(device))
    return peak.tflops if peak else None


class StepMeter:
    """What the updates since the last report cost: items (the task's tokens, or examples), examples, time waiting
    for data and the rest, and the loss summed over items. Counts stay on the device between reports (no sync per
    step); a report adds them up over the ranks, once.

    `report()` gives rates over the window it closes; `totals()` over the run in this process after its first
    report window, which pays for warm-up (allocations, kernel choices, caches): the first window's own when there is
    only one."""

    def __init__(self, process, flops_per_token: float | None, counts_tokens: bool):
        self.process, self.counts_tokens = process, counts_tokens
        self.peak_tflops = peak_tflops_of(process.device)
        self.flops_per_token = flops_per_token
        self.runs = {"items": 0.0, "examples": 0.0, "seconds": 0.0}
        self.windows = 0
        self._open()

    def _open(self) -> None:
        import torch

        self.started = time.perf_counter()
        self.data_seconds = 0.0
        self.updates = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.process.device)
        self.items = torch.zeros((), dtype=torch.float64, device=self.process.device)
        self.examples = 0

    def add(self, loss_sum, items, examples: int, data_seconds: float) -> None:
        """One update: this rank's loss summed over its items, the items of the update over all ranks, this rank's
        examples, and the seconds it waited for them."""
        self.loss_sum += loss_sum
        self.items += items
        self.examples += examples
        self.data_seconds += data_seconds
        self.updates += 1

    @property
    def pending(self) -> int:
        return self.updates

    def exclude(self, seconds: float) -> None:
        """Time spent on something else than training (an evaluation, a checkpoint) leaves the window's clock."""
        self.started += seconds

    def report(self) -> dict:
        """The window since the last report (every rank calls it: one all-reduce), and a new window opened."""
        from . import distributed

        loss_sum, examples, data_seconds = distributed.sum_over_ranks(
            self.process, float(self.loss_sum), float(self.examples), self.data_seconds)
        items = float(self.items)  # already over every rank
        seconds = time.perf_counter() - self.started
        window = {"loss": loss_sum / items if items else float("nan"), "updates": self.updates, "items": items,
                  "examples": examples, "seconds": seconds,
                  "data_seconds_per_step": data_seconds / self.process.world_size / max(self.updates, 1),
                  "step_seconds": seconds / max(self.updates, 1)}
        self.windows += 1
        if self.windows == 1:
            self.first = window
        else:
            for name in self.runs:
                self.runs[name] += window[name]
        self._open()
        return {**window, **self.rates(items, examples, seconds)}

    def rates(self, items: float, examples: float, seconds: float) -> dict:
        per_second = items / seconds if seconds > 0 else float("nan")
        figures = {"examples_per_second": examples / seconds if seconds > 0 else float("nan"),
                   "tokens_per_second": per_second if self.counts_tokens else None, "mfu": None}
        if self.counts_tokens and self.flops_per_token and self.peak_tflops:
            figures["mfu"] = mfu(per_second, self.flops_per_token, self.process.world_size, self.peak_tflops)
        return figures

    def totals(self) -> dict:
        """The run's rates in this process, its first report window left out where there are others."""
        if self.windows == 0:
            return self.rates(0.0, 0.0, 0.0)
        runs = self.runs if self.windows > 1 else self.first
        return self.rates(runs["items"], runs["examples"], runs["seconds"])
