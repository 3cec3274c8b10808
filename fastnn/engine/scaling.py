"""When data parallelism pays: an estimate of what splitting a batch over GPUs saves against what summing the
gradients costs, behind the one warning a small model trained on several GPUs gets.

Measured on 2 x H200 (NVLink, NCCL 2.28, benchmarks/bench_scaling.py, the graph engine in "mixed"): MLP
784-4096x3-10 at global batch 8192 trains 1.55x faster on two GPUs than on one; logistic regression at batch 128
0.62x and MLP 784-128x3-10 at batch 32 0.66x, i.e. slower. A step's GEMMs shrink with the share of the batch; the
gradient sums do not shrink, and every layer's all-reduce has a fixed latency. `DataParallelCosts` holds the rates
read off that run; `one_gpu_is_faster` compares the two sides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DataParallelCosts", "one_gpu_is_faster"]


@dataclass(frozen=True)
class DataParallelCosts:
    """Rates behind the estimate, from the 2 x H200 run above: the graph engine's GEMM rate at MLP-4096 (1.81 TFLOP a
    step in 2.92 ms: ~620 TFLOP/s), the gradient sum's exposed rate (74 MB of fp16 gradients cost 0.29 ms a step
    beyond the ideal: ~255 GB/s) and a collective's fixed cost per layer (~10 us: MLP-128's two-GPU step is 23 us
    longer than one GPU's for four all-reduces and the epoch's vote)."""

    gemm_flops_per_s: float = 620e12
    sum_bytes_per_s: float = 255e9
    collective_latency_s: float = 10e-6


def one_gpu_is_faster(sizes: list[int], batch: int, world: int, grad_bytes: int,
                      costs: DataParallelCosts = DataParallelCosts()) -> tuple[bool, float, float]:  # fmt: skip
    """(True when the GEMM time `world` GPUs save on a batch is smaller than the gradient sums cost, the seconds
    saved, the seconds the sums cost) for an MLP of layer widths `sizes` at global batch `batch`."""
    params = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
    step_flops = 6.0 * params * batch  # forward, input gradient and weight gradient GEMMs
    saved = step_flops * (1.0 - 1.0 / world) / costs.gemm_flops_per_s
    cost = params * grad_bytes / costs.sum_bytes_per_s + (len(sizes) - 1) * costs.collective_latency_s
    return bool(saved < cost), float(saved), float(cost)


def grad_bytes_of(precision: str) -> int:
    """Bytes of one gradient element as the graph engine sums them: fp16 in "mixed" and "fp16", else fp32."""
    return int(np.dtype(np.float16 if precision in ("mixed", "fp16") else np.float32).itemsize)
