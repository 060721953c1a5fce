"""How fast a run trains: tokens (or examples) per second, model FLOPs utilisation (MFU), and where a step's time goes.
One definition, so the loop's progress lines, MLflow and metrics.json match the GPU check (benchmarks/gpu_check.py).
MFU needs the task's `flops_per_token` and a peak: NVIDIA's dense 16-bit figure of a GPU listed in gpu_peaks.yaml."""

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Peak:
    model: str
    tflops: float | None  # dense tensor-core TFLOP/s in `precision`; None: NVIDIA publishes none
    precision: str  # "bf16", or "fp16" on GPUs without bfloat16
    source: str  # the data sheet


# Keys: the driver's names, as `peak_of` normalises them.
PEAKS = {name: Peak(**figures) for name, figures in
         yaml.safe_load(Path(__file__).with_name("gpu_peaks.yaml").read_text()).items()}


def peak_of(device_name: str) -> Peak | None:
    """The GPU's peak by its exact name (case and a leading NVIDIA/Tesla aside); None for a GPU not listed."""
    return PEAKS.get(" ".join(device_name.split()).lower().removeprefix("nvidia ").removeprefix("tesla "))


def mfu(tokens_per_second: float, flops_per_token: float, gpus: int, peak_tflops: float) -> float:
    """The share of the GPUs' summed peak the model's FLOPs reached (0.45 = 45%)."""
    return tokens_per_second * flops_per_token / (gpus * peak_tflops * 1e12)


def peak_tflops_of(device) -> float | None:
    import torch

    peak = peak_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return peak.tflops if peak else None


class StepMeter:
    """What the updates cost: items (tokens, or examples), examples, loss summed over items, training seconds and those
    spent waiting for data, on the device until `settle()` (every rank calls it) sums them over the ranks. `report()`:
    the window since the last report; `settle()`: an epoch's or a checkpoint's totals, the report's window left whole;
    `totals()`: the run's figures past its first settlement (the warm-up), or the first's if it is the only one."""

    FIELDS = ("loss_sum", "items", "examples", "data_seconds", "updates", "seconds")

    def __init__(self, process, flops_per_token: float | None, counts_tokens: bool):
        import torch

        self.process, self.counts_tokens, self.flops_per_token = process, counts_tokens, flops_per_token
        self.peak_tflops = peak_tflops_of(process.device)
        self.zero = lambda: torch.zeros((), dtype=torch.float64, device=process.device)  # noqa: E731
        self.loss_sum, self.items, self.examples, self.data_seconds, self.updates = self.zero(), self.zero(), 0, 0.0, 0
        self.window = dict.fromkeys(self.FIELDS, 0.0)
        self.settlements: list[dict] = []
        self.settled_at = time.perf_counter()
        self.paused_at: float | None = None

    def add(self, loss_sum, items, examples: int, data_seconds: float) -> None:
        """One update: this rank's summed loss, all ranks' items, this rank's examples and seconds waiting for data."""
        self.loss_sum, self.items = self.loss_sum + loss_sum, self.items + items
        self.examples, self.updates = self.examples + examples, self.updates + 1
        self.data_seconds += data_seconds

    @contextmanager
    def paused(self):
        """Time spent on something else than training (an evaluation, a checkpoint) counts in no settlement."""
        self.paused_at = time.perf_counter()
        try:
            yield
        finally:
            stopped, self.paused_at = time.perf_counter() - self.paused_at, None
            self.settled_at += stopped

    def settle(self) -> dict:
        """The updates since the last settlement: sums over the ranks, but `updates` and `seconds` are this rank's."""
        from . import ranks

        now = self.paused_at if self.paused_at is not None else time.perf_counter()
        loss_sum, examples, data_seconds = ranks.sum_over_ranks(
            self.process, float(self.loss_sum), float(self.examples), self.data_seconds)
        settled = {"loss_sum": loss_sum, "items": float(self.items), "examples": examples,  # items: over all already
                   "data_seconds": data_seconds, "updates": self.updates, "seconds": now - self.settled_at}
        self.loss_sum, self.items, self.examples, self.data_seconds, self.updates = self.zero(), self.zero(), 0, 0.0, 0
        self.settled_at = now
        self.window = {name: self.window[name] + settled[name] for name in self.FIELDS}
        self.settlements.append(settled)
        return settled

    def report(self) -> tuple[dict, dict]:
        """(The window since the last report: its loss and `figures`; what it settled), and a new window."""
        settled, window = self.settle(), self.window
        self.window = dict.fromkeys(self.FIELDS, 0.0)
        return {"train_loss": window["loss_sum"] / window["items"] if window["items"] else float("nan"),
                **self.figures(window)}, settled

    def figures(self, sums: dict) -> dict:
        """Rates, a step's seconds and the share of them this rank waited for data (the ranks' mean)."""
        seconds, updates = sums["seconds"], max(sums["updates"], 1)
        per_second = sums["items"] / seconds if seconds > 0 else float("nan")
        rates = {"examples_per_second": sums["examples"] / seconds if seconds > 0 else float("nan"),
                   "tokens_per_second": per_second if self.counts_tokens else None, "mfu": None,
                   "step_seconds": seconds / updates,
                   "data_wait_share": sums["data_seconds"] / self.process.world_size / seconds if seconds > 0 else 0.0}
        if self.counts_tokens and self.flops_per_token and self.peak_tflops:
            rates["mfu"] = mfu(per_second, self.flops_per_token, self.process.world_size, self.peak_tflops)
        return rates

    def totals(self) -> dict:
        steady = self.settlements[1:] or self.settlements
        return self.figures({name: sum(part[name] for part in steady) for name in self.FIELDS})
