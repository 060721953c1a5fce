"""Dense 16-bit tensor-core peaks of NVIDIA GPUs, looked up by the exact name the driver reports.

The name is what `torch.cuda.get_device_name()` and `nvidia-smi --query-gpu=name` print (e.g. "NVIDIA H100 80GB
HBM3"), matched whole, never by substring: "NVIDIA L40" is not an L4, "NVIDIA H200 NVL" is not an H200 SXM. Figures
are NVIDIA's data-sheet figures without sparsity (the data sheets print the sparse figure, twice these). A name not
listed gets no figure: MFU is then unknown unless the caller gives a peak.
"""

from __future__ import annotations

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
