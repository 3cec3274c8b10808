"""The grid engine's plan: pure arithmetic on shapes (no GPU), so the limits are tested on the CPU.

`native/grid.cu` trains a whole epoch in one cooperative launch of P CTAs (at most one per SM). This module picks
P and the hidden units each CTA owns, mirrors the kernel's shared-memory and global-scratch layouts (the kernel
checks at compile time that it needs no more than the bytes computed here), and says why a model cannot be
served, naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import EngineConfig
from ..plan import param_layout

__all__ = [
    "HOPPER_SMS", "HOPPER_SMEM", "MAX_BATCH", "MAX_SCRATCH", "MAX_WIDTH", "MIN_CC", "THREADS", "UNITS_PER_CTA",
    "GridPlan", "grid_plan", "rounds_per_step", "scratch_floats", "smem_floats",
]  # fmt: skip

#: Threads per CTA (8 warps).
THREADS = 256
#: Hidden units of the widest layer a CTA owns, as the probe measured best (grid.md: h/8 CTAs up to h = 1024).
UNITS_PER_CTA = 8
#: Rows of a step the kernel's scratch and index tables are compiled for at most: larger batches run near the
#: GEMM libraries' peak and stay with the graph engine.
MAX_BATCH = 1024
#: Widest layer (inputs and classes included) the kernel is written for.
MAX_WIDTH = 8192
#: Global scratch (exchange buffers, head copies, per-CTA regions) the engine allocates at most.
MAX_SCRATCH = 8 << 30
#: Products' K chunk (grid.cu's KC) and the widest tile pair of a chunk (TM + 4 + TN + 4 floats a k).
KC = 64
TILE_WIDTH = 144
#: Shared memory a CTA may use on sm_90 (227 KiB) and the H100's SM count, when no device is given.
HOPPER_SMEM = 232448
HOPPER_SMS = 132
MIN_CC = 90  # cooperative launch of one CTA per SM with > 114 KB of shared memory, fence/acquire PTX of sm_90

_PREC = {"fp32": 0, "mixed": 1, "fp16": 2}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _up4(a: int) -> int:
    return _cdiv(a, 4) * 4


def _up32(a: int) -> int:
    return _cdiv(a, 32) * 32


def rounds_per_step(hidden_layers: int) -> int:
    """Grid-wide rounds a step: one after each hidden layer's forward, one per backward boundary (dZ of layers
    NH-2 .. 1) that cannot be computed redundantly."""
    return hidden_layers + max(0, hidden_layers - 2)


def units(sizes: tuple[int, ...], ctas: int) -> tuple[int, ...]:
    """Units of each hidden layer a CTA owns (the last CTAs may own fewer, or none, of a narrower layer)."""
    return tuple(_cdiv(w, ctas) for w in sizes[1:-1])


def smem_floats(batch: int, classes: int, n_state: int) -> int:
    """Shared memory of one CTA in 4-byte words, as grid.cu's make_smem(): the product tiles, the step's sample
    indices and labels, the replicated head bias with its optimizer state and gradient, per-warp loss sums."""
    return KC * TILE_WIDTH + 2 * _up4(batch) + _up4(classes) * (2 + n_state) + 4 * (THREADS // 32)


def scratch_floats(sizes: tuple[int, ...], batch: int, ctas: int) -> int:
    """Global scratch in 4-byte words, as grid.cu's make_scratch(): H and Z of every hidden layer by step parity,
    the exchanged dZ of layers 1 .. NH-2, the head's two operand copies, and per CTA its logits, the last hidden
    layer's whole dZ, its own slice of dZ_0 and the step's inputs as operands."""
    nh = len(sizes) - 2
    o = 0
    for _ in range(2):
        for layer in range(nh):
            o += 2 * _up32(batch * sizes[layer + 1])
    for layer in range(nh):
        o += _up32(batch * sizes[layer + 1]) if 1 <= layer <= nh - 2 else 0
    o += 2 * _up32(sizes[-1] * sizes[-2])
    nb0 = units(sizes, ctas)[0]
    o += ctas * (_up32(batch * sizes[-1]) + _up32(batch * sizes[-2]) + _up32(batch * nb0) + _up32(batch * sizes[0]))
    return o


@dataclass(frozen=True)
class GridPlan:
    """What the grid kernel is compiled and launched with for one model, batch, precision and GPU."""

    ctas: int  #: P, one per SM at most, all resident (cooperative launch)
    units: tuple[int, ...]  #: hidden units of each layer a CTA owns
    threads: int
    smem_bytes: int
    scratch_bytes: int
    rounds: int  #: grid-wide rounds a step
    options: tuple[str, ...]  #: NVRTC -D options of native/grid.cu


def grid_plan(
    config: EngineConfig, x_dtype: np.dtype | type, sm_count: int = HOPPER_SMS, smem_limit: int = HOPPER_SMEM
) -> GridPlan | str:
    """The plan for `config` with inputs of `x_dtype` on a GPU of `sm_count` SMs and `smem_limit` bytes of shared
    memory per CTA, or a reason (naming the limit) it cannot be served."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    nh = len(sizes) - 2
    if nh < 1:
        return "no hidden layer to spread; use engine='fused' or 'graph'"
    widest = max(sizes)
    if widest > MAX_WIDTH:
        return f"a layer of {widest} is wider than the grid kernel's {MAX_WIDTH}"
    batch = config.batch_size
    if batch > MAX_BATCH:
        return f"a batch of {batch} rows is over the grid kernel's maximum of {MAX_BATCH}"
    n_state = len(opt.state_names)
    need = 4 * smem_floats(batch, sizes[-1], n_state)
    if need > smem_limit:
        return (
            f"a batch of {batch} with {sizes[-1]} classes needs {need:,} bytes of shared memory per CTA, over the "
            f"GPU's {smem_limit:,}"
        )
    ctas = max(1, min(sm_count, _cdiv(max(sizes[1:-1]), UNITS_PER_CTA)))
    scratch = 4 * scratch_floats(sizes, batch, ctas)
    if scratch > MAX_SCRATCH:
        return (
            f"the model {list(sizes)} at a batch of {batch} needs {scratch:,} bytes of global scratch over {ctas} "
            f"CTAs, over the grid kernel's {MAX_SCRATCH:,}"
        )
    kernel = opt.kernel_params()
    layout = param_layout(model)
    options = (
        "-std=c++17",
        f"-DGRID_NL={len(sizes) - 1}",
        f"-DGRID_SIZES={{{','.join(str(s) for s in sizes)}}}",
        f"-DGRID_OFFS={{{','.join(str(o) for o in layout.offsets)}}}",
        f"-DGRID_P={ctas}",
        f"-DGRID_B={batch}",
        f"-DGRID_NT={THREADS}",
        f"-DGRID_XIN={0 if np.dtype(x_dtype) == np.uint8 else 1}",
        f"-DGRID_PREC={_PREC[config.precision]}",
        f"-DGRID_ACT={0 if model.activation == 'relu' else 1}",
        f"-DGRID_OPT={kernel.kind}",
        f"-DGRID_NS={n_state}",
        f"-DGRID_SMEM={need}",
        f"-DGRID_SCRATCH={scratch}",
        f"-DGRID_LOSS={int(config.loss == 'mse')}",
    ) + (("-DGRID_PROFILE",) if config.tuning.grid_profile else ())
    return GridPlan(ctas=ctas, units=units(sizes, ctas), threads=THREADS, smem_bytes=need, scratch_bytes=scratch,
                    rounds=rounds_per_step(nh), options=options)  # fmt: skip
