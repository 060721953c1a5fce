"""Model FLOPs utilisation (MFU) of training a decoder-only transformer: the FLOPs the model needs per token, at
the throughput reached, over what the GPUs could do at their peak.

FLOPs per token (PaLM, appendix B): 6 x N for the weights' matrix multiplies (2 forward, 4 backward), plus
12 x n_layer x d_model x seq_len for attention's scores and weighted sums (forward and backward, the causal mask's
saving not subtracted). N counts every parameter that multiplies activations: the tied embedding (it is also the
output layer) but not the position embedding, which is only added. MFU counts the model's FLOPs, not the hardware's
(no recomputation, no padding).
"""

from __future__ import annotations

FORMULA = ("MFU = tokens/s x (6 x N + 12 x n_layer x d_model x seq_len) / (n_gpus x peak FLOP/s), "
           "N = parameters in matrix multiplies (position embedding left out)")


def training_flops_per_token(matmul_parameters: int, layers: int, width: int, context: int) -> int:
    return 6 * matmul_parameters + 12 * layers * width * context


def mfu(tokens_per_second: float, flops_per_token: float, gpus: int, peak_tflops: float) -> float:
    """The share of the GPUs' summed peak the model's FLOPs reached (0.45 = 45%)."""
    return tokens_per_second * flops_per_token / (gpus * peak_tflops * 1e12)
