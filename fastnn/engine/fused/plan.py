"""The fused engine's plan: pure arithmetic on shapes (no GPU), so the limits are tested on the CPU.

`native/fused.cu` trains a whole epoch in one cluster of CTAs with everything in shared memory. This module
mirrors its shared-memory layout (the kernel checks at compile time that it needs no more than the bytes
computed here), picks the layout (standard or lean), the rows per chunk and tensor cores or FMA (within what the
config's `Tuning` allows), and says why a model cannot be held, naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._optim import KIND_SGD
from ..base import EngineConfig
from ..plan import param_layout

__all__ = ["CLUSTER", "MIN_CC", "MMA_MIN_ROWS", "THREADS", "FusedPlan", "fused_plan", "smem_floats"]

#: CTAs in the cluster: 16 (non-portable, allowed on H100/H200), the most Hopper runs as one cluster.
CLUSTER = 16
#: Threads per CTA.
THREADS = 256
#: Rows per chunk tried, largest first: fewer chunks mean fewer barriers per step.
CHUNK_ROWS = (128, 64, 32, 16, 8, 4)
#: Shared memory a CTA may use on sm_90 (227 KiB); the device's own figure is used when known.
HOPPER_SMEM = 232448
#: Widest layer (inputs included) the kernel's register tiles and index arithmetic are written for.
MAX_WIDTH = 4096
MIN_CC = 90  # clusters and distributed shared memory: Hopper and newer
# The shared-memory layouts tried (standard, lean: fused.cu's FOLD and OPC) and whether products use tensor cores
# are Tuning.fused_layouts and Tuning.tensor_cores (fastnn/engine/tuning.py, with their measurements).
#: The tensor-core path (mma.sync, fp16 operands, fp32 accumulation) takes chunks of at least this many rows;
#: "fp32" (no TF32) and smaller chunks use scalar FMA. Measured on an H100 (bench_fused.py): 784-256x3-10 at 4 rows
#: 175 us a step on tensor cores against 148 with FMA (the 16-row tiles three quarters empty).
MMA_MIN_ROWS = 16

_PREC = {"fp32": 0, "mixed": 1, "fp16": 2}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _up4(a: int) -> int:
    return _cdiv(a, 4) * 4


def smem_floats(
    sizes: tuple[int, ...],
    rows: int,
    cluster: int,
    n_state: int,
    half_copy: bool,
    x_itemsize: int = 1,
    fold: bool = False,
    mma: bool = False,
) -> int:
    """Shared memory of one CTA in 4-byte words: the same layout as fused.cu's make_layout(). `half_copy`: the
    fp16 operand copy (OPC); `fold`: no gradient arrays (FOLD); `mma`: the tensor-core path's scratch (MMA)."""
    L = len(sizes) - 1
    NH = L - 1
    C = sizes[-1]

    def per(layer: int) -> int:
        return _up4(_cdiv(sizes[layer + 1], cluster))

    KP = _up4(_cdiv(sizes[0], cluster)) if L == 1 else per(L - 2)
    XLD = KP if L == 1 else _up4(sizes[0])
    RR = _cdiv(rows, cluster)
    o = 0
    for k in range(L):
        n = (per(k) if k < NH else C) * (_up4(sizes[k]) if k < NH else KP)
        nb = per(k) if k < NH else _up4(C)
        o += (1 if fold else 2) * (n + nb)  # master and gradient
        o += n_state * (n + nb)
        o += _up4(n // 2 + 1) if half_copy else 0
    o += rows * XLD
    XW = KP if L == 1 else sizes[0]
    o += _up4(_cdiv(rows * XW * x_itemsize, 4))  # the next chunk's raw rows
    for k in range(NH):
        o += rows * per(k)
        o += rows * _up4(sizes[k + 1]) if k < NH - 1 else 0
    o += rows * KP if NH >= 1 else 0
    o += cluster * RR * _up4(C)
    o += rows * _up4(C)
    rs_width = max([4] + [per(k - 1) for k in range(1, NH)])
    o += 2 * cluster * rows * rs_width if NH >= 2 else 0
    o += 3 * rows  # labels, and the next chunk's sample indices and labels (a regression's: sample indices)
    o += 4 * (THREADS // 32)  # per-warp loss and correct sums (doubles)
    o += (THREADS // 32) * 128 if mma else 0  # per-warp 16x8 partial tiles of a K split
    return o


@dataclass(frozen=True)
class FusedPlan:
    """What the fused kernel is compiled and launched with for one model, batch and precision."""

    rows: int  #: rows per chunk (R)
    cluster: int
    threads: int
    smem_bytes: int
    options: tuple[str, ...]  #: NVRTC -D options of native/fused.cu


def fused_plan(config: EngineConfig, x_dtype: np.dtype | type, smem_limit: int = HOPPER_SMEM) -> FusedPlan | str:
    """The plan for `config` with inputs of `x_dtype`, or a reason (naming the limit) it cannot be held."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    widest = max(sizes)
    if widest > MAX_WIDTH:
        return f"a layer of {widest} is wider than the fused kernel's {MAX_WIDTH}"
    n_state = len(opt.state_names)
    kernel = opt.kernel_params()  # what fused.cu is compiled for (FUSED_OPT) and launched with
    # Folding needs the buffer to be the whole update: SGD with momentum, not Nesterov (which also needs g).
    can_fold = kernel.kind == KIND_SGD and n_state == 1 and not kernel.nesterov
    first = min(_up4(config.batch_size), CHUNK_ROWS[0])  # a chunk never needs more rows than the batch
    fits = None
    tuning = config.tuning
    for kind in tuning.fused_layouts:
        lean = kind == "lean"
        half_copy = config.precision == "mixed" and not lean
        fold = lean and can_fold
        for rows in [first] + [r for r in CHUNK_ROWS if r < first]:
            mma = tuning.tensor_cores and config.precision != "fp32" and rows >= MMA_MIN_ROWS
            need = 4 * smem_floats(sizes, rows, CLUSTER, n_state, half_copy, np.dtype(x_dtype).itemsize, fold, mma)
            if need <= smem_limit:
                fits = (rows, need, half_copy, fold, mma)
                break
        if fits:
            break
    if fits is None:
        held = ["weights"] + ([] if fold else ["gradients"]) + (["optimizer state"] if n_state else [])
        state = ", ".join(held[:-1]) + " and " + held[-1] if len(held) > 1 else held[0]
        return (
            f"the model {list(sizes)} with {type(opt).__name__} in {config.precision!r} needs {need:,} bytes of "
            f"shared memory per CTA even at {rows} rows per chunk, over the GPU's {smem_limit:,} "
            f"({state} of 1/{CLUSTER} of the model live on each of {CLUSTER} CTAs)"
        )
    rows, need, half_copy, fold, mma = fits
    layout = param_layout(model)
    offs = ",".join(str(o) for o in layout.offsets)
    options = (
        "-std=c++17",
        f"-DFUSED_NL={len(sizes) - 1}",
        f"-DFUSED_SIZES={{{','.join(str(s) for s in sizes)}}}",
        f"-DFUSED_OFFS={{{offs}}}",
        f"-DFUSED_CL={CLUSTER}",
        f"-DFUSED_R={rows}",
        f"-DFUSED_NT={THREADS}",
        f"-DFUSED_XIN={0 if np.dtype(x_dtype) == np.uint8 else 1}",
        f"-DFUSED_PREC={_PREC[config.precision]}",
        f"-DFUSED_ACT={0 if model.activation == 'relu' else 1}",
        f"-DFUSED_OPT={kernel.kind}",
        f"-DFUSED_NS={n_state}",
        f"-DFUSED_SMEM={need}",
        f"-DFUSED_OPC={int(half_copy)}",
        f"-DFUSED_FOLD={int(fold)}",
        f"-DFUSED_MMA={int(mma)}",
        f"-DFUSED_LOSS={int(config.loss == 'mse')}",
    ) + (("-DFUSED_PROFILE",) if tuning.fused_profile else ())
    return FusedPlan(rows=rows, cluster=CLUSTER, threads=THREADS, smem_bytes=need, options=options)
