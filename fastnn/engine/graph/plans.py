"""The graph engine's library plans: cuBLASLt GEMMs with bias, activation and their gradients fused in the
epilogue, and cuDNN's softmax; made before any capture (plans, heuristics and autotuning may fail or query).

Row-major (rows, d) arrays are used as column-major (d, rows) matrices throughout, so a layer's forward is
Z^T = W @ H^T with W in torch's (out, in) layout read as transposed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...cuda import cublaslt, cudnn
from ..plan import gelu_aux_ld, relu_aux_ld
from .buffers import Layer, itemsize

if TYPE_CHECKING:
    from .resources import Resources

__all__ = ["aux_bytes", "aux_ld", "backward_plans", "forward_plans", "matmul", "run", "softmax"]


def matmul(res: Resources, m, n, k, transa, transb, ab, cd, epilogue, lda, ldb, ldc, aux_ld=None,
           beside_comm=False) -> cublaslt.Matmul:  # fmt: skip
    """A cuBLASLt plan for column-major D (m, n) in this precision's compute type; beside_comm: it may run
    while all-reduces do (a backward GEMM of a data-parallel engine), so it leaves Tuning.gemm_sm_carveout SMs."""
    lt, tuning = cublaslt, res.config.tuning
    carve = tuning.gemm_sm_carveout if (beside_comm and res.group is not None) else 0
    return lt.Matmul(
        res.lt, m, n, k, transa=transa, transb=transb,
        ab_type=lt.DataType.R_16F if ab == np.float16 else lt.DataType.R_32F,
        cd_type=lt.DataType.R_16F if cd == np.float16 else lt.DataType.R_32F,
        compute=lt.ComputeType.COMPUTE_16F if res.spec.compute_16f else lt.ComputeType.COMPUTE_32F,
        lda=lda, ldb=ldb, ldc=ldc, epilogue=epilogue, aux_ld=aux_ld, workspace=res.workspace,
        max_algos=tuning.autotune_algos,
        sm_count_target=min(max(1, res.dev.sm_count - carve), res.dev.sm_count) if carve else 0,
    )  # fmt: skip


def softmax(res: Resources, rows: int) -> cudnn.Softmax:
    return cudnn.Softmax(res.dnn, rows, res.config.model.classes, "fp16" if res.spec.logits == np.float16 else "fp32")


def forward_plans(res: Resources, layers: list[Layer], rows: int, training: bool, own: Callable) -> None:
    """Forward plans for `rows`: bias + activation fused (keeping aux when training); bias on the last."""
    E = cublaslt.Epilogue
    relu = res.config.model.activation == "relu"
    act = (E.RELU_AUX_BIAS if relu else E.GELU_AUX_BIAS) if training else (E.RELU_BIAS if relu else E.GELU_BIAS)
    last = len(layers) - 1
    for i, ((d_in, d_out), layer) in enumerate(zip(res.config.model.layers, layers)):
        out_t = res.out_type(i)
        ld = aux_ld(res, d_out) if (training and i < last) else None
        layer.fwd[rows] = own(matmul(
            res, d_out, rows, d_in, True, False, res.spec.operand, out_t,
            act if i < last else E.BIAS, d_in, d_in, d_out, ld,
        ))  # fmt: skip


def backward_plans(res: Resources, layers: list[Layer], rows: int, own: Callable) -> None:
    """Backward plans for `rows`: each layer's weight gradient, and below the first its input gradient times the
    previous activation's gradient (its aux)."""
    # Bias gradients, chosen by measurement (benchmarks/bench_kernels.py, H200): the last layer's
    # comes from the loss kernel (a BGRADB epilogue on logistic regression's skinny wgrad cost 9 us
    # against ~1 us in the kernel); hidden layers' from BGRADB on their wgrad GEMM (within 0.1 us of
    # no epilogue there; a column-sum kernel gave the same whole step with one node more:
    # benchmarks/kernels/colsum.py), not DRELU_BGRAD on the dgrad GEMM (~8 us against ~3 us for DRELU alone).
    spec = res.spec
    E = cublaslt.Epilogue
    bwd_act = E.DRELU if res.config.model.activation == "relu" else E.DGELU
    last = len(res.config.model.layers) - 1
    for i, (d_in, d_out) in enumerate(res.config.model.layers):
        layer = layers[i]
        # dW^T (d_in, d_out) = H^T @ dZ; hidden layers' bias gradient (column sums of dZ) as BGRADB.
        layer.dw[rows] = own(matmul(
            res, d_in, d_out, rows, False, True, spec.operand, spec.grad,
            E.BGRADB if i < last else E.DEFAULT, d_in, d_out, d_in, beside_comm=True,
        ))  # fmt: skip
        if i > 0:
            # dH^T (d_in, rows) = W^T @ dZ^T, times the previous activation's gradient (its aux).
            layer.dx[rows] = own(matmul(
                res, d_in, rows, d_out, False, False, spec.operand, spec.operand,
                bwd_act, d_in, d_out, d_in, aux_ld(res, d_in), beside_comm=True,
            ))  # fmt: skip


def aux_ld(res: Resources, rows: int) -> int:
    return relu_aux_ld(rows) if res.config.model.activation == "relu" else gelu_aux_ld(rows)


def aux_bytes(res: Resources, d_out: int, batch: int) -> int:
    if res.config.model.activation == "relu":
        return relu_aux_ld(d_out) // 8 * batch
    return gelu_aux_ld(d_out) * batch * itemsize(res.spec.operand)


def run(plan: cublaslt.Matmul, autotune: bool, stream, a: int, b: int, c: int, d: int, bias: int = 0,
        aux: int = 0) -> None:  # fmt: skip
    """Queue `plan` on `stream`; autotune: time its candidates on these buffers first (outside capture)."""
    if autotune:
        plan.autotune(a, b, c, d, stream, bias=bias, aux=aux)
    plan(a, b, c, d, stream, bias=bias, aux=aux)
