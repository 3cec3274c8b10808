"""The grid engine's plan: pure arithmetic on shapes (no GPU), so the limits are tested on the CPU.

Two kernels train a whole epoch in one cooperative launch of P CTAs (at most one per SM): `native/grid_fast.cu`,
the fast path (the measured probe's design: masters on chip, fp16 exchange, tensor cores), for the models `fast_plan`
accepts (three equal hidden layers of 128..8*SMs units in steps of 128, uint8 or float32 inputs, "mixed", ReLU,
cross-entropy with 2..16 classes, batch <= 32, SGD with or without momentum, or AdamW); and `native/grid_stream.cu`,
the streaming path (the same design with every master in HBM, read and written once a step), for the wider models
`stream_plan` accepts (three equal hidden layers of 16, 32 or 64 units a CTA: 2048, 4096 and 8192 on an H100; uint8
inputs, SGD, with momentum up to 32 units a CTA). Every other model is refused by name (engine='graph' trains it):
the generic version 1 that served them (grid.cu) was 14-122x slower than the graph engine, and left native/. This
module picks the kernel, P and the hidden units each CTA owns, mirrors each kernel's shared-memory and
global-scratch layouts (the kernels check at compile time that they need no more than the bytes computed here), and
says why a model cannot be served, naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._data import input_affine
from ..._loss import KIND_XENT, describe
from ..._optim import KIND_ADAMW, KIND_SGD
from ..base import EngineConfig
from ..plan import param_layout

__all__ = [
    "FAST_MAX_BATCH", "FAST_MAX_CLASSES", "FAST_PHASES", "FAST_UNIT_STEP", "HOPPER_SMS", "HOPPER_SMEM",
    "MAX_SCRATCH", "MAX_WIDTH", "MIN_CC", "STREAM_CHUNK", "STREAM_MAX_FEATURES", "STREAM_PHASES", "STREAM_STAGES",
    "STREAM_UNITS", "THREADS", "UNITS_PER_CTA", "GridPlan", "fast_plan", "fast_scratch_bytes", "fast_smem_bytes",
    "grid_plan", "rounds_per_step", "stream_plan", "stream_scratch_bytes", "stream_smem_bytes",
]  # fmt: skip

#: Threads per CTA (8 warps).
THREADS = 256
#: Hidden units of the widest layer a CTA owns, as the probe measured best (grid.md: h/8 CTAs up to h = 1024).
UNITS_PER_CTA = 8
#: Widest layer (inputs and classes included) the kernel is written for.
MAX_WIDTH = 8192
#: Global scratch (exchange buffers, head copies, per-CTA regions) the engine allocates at most.
MAX_SCRATCH = 8 << 30
#: Shared memory a CTA may use on sm_90 (227 KiB) and the H100's SM count, when no device is given.
HOPPER_SMEM = 232448
HOPPER_SMS = 132
MIN_CC = 90  # cooperative launch of one CTA per SM with > 114 KB of shared memory, fence/acquire PTX of sm_90

_PREC = {"fp32": 0, "mixed": 1, "fp16": 2}

#: The fast kernel (native/grid_fast.cu): rows a step (a shorter batch is masked), the hidden width's step (16-unit
#: k-steps, 8 per warp), the most classes (one m16 tile of logits^T).
FAST_MAX_BATCH = 32
FAST_UNIT_STEP = 128
FAST_MAX_CLASSES = 16
#: Names of the phases -DGRID_PROFILE times (native/grid_fast.cu's NPHASE).
FAST_PHASES = ("batch wait", "B0+F0", "R1", "F1", "R2", "F2", "R3", "head", "dZ2+B2 dgrad", "R5 window", "R5 wait",
               "B1")  # fmt: skip
#: native/grid_stream.cu's phases: as FAST_PHASES, but B2 (dgrad, weight gradient and update, one pass over W2's
#: masters) all before R5, and the window after R5's arrival holds W3's update.
STREAM_PHASES = ("batch wait", "B0+F0", "R1", "F1", "R2", "F2", "R3", "head", "dZ2+B2", "W3 update", "R5 wait",
                 "B1")  # fmt: skip
#: The streaming kernel (native/grid_stream.cu): hidden units a CTA owns (the fewest whose chunk divides h into at
#: least STREAM_STAGES chunks and whose h / NB CTAs fit the SMs, so odd multiples of 128 take 64 units; momentum up
#: to 32), units of an activation chunk (the ring's stage: 256, or 128 at 64 units a CTA, whose weight stages and
#: cross-warp sums would not fit shared memory beside 256-unit ones), the ring's stages (every pass issues that many
#: chunks before its first wait, so an activation has at least as many: the kernel's static_assert), the most input
#: features (8 k-steps of 16 a warp, unrolled).
STREAM_UNITS = (16, 32, 64)
STREAM_CHUNK = 256
STREAM_STAGES = 3
STREAM_MAX_FEATURES = 1024


def stream_chunk(units_per_cta: int) -> int:
    """Units of an activation chunk of native/grid_stream.cu at `units_per_cta` units a CTA (its CU)."""
    return STREAM_CHUNK // 2 if units_per_cta == 64 else STREAM_CHUNK


def rounds_per_step(hidden_layers: int) -> int:
    """Grid-wide rounds a step: one after each hidden layer's forward, one per backward boundary (dZ of layers
    NH-2 .. 1) that cannot be computed redundantly."""
    return hidden_layers + max(0, hidden_layers - 2)


@dataclass(frozen=True)
class GridPlan:
    """What the grid kernel is compiled and launched with for one model, batch, precision and GPU."""

    ctas: int  #: P, one per SM at most, all resident (cooperative launch)
    units: tuple[int, ...]  #: hidden units of each layer a CTA owns
    threads: int
    smem_bytes: int
    scratch_bytes: int
    rounds: int  #: grid-wide rounds a step
    options: tuple[str, ...]  #: NVRTC -D options of the kernel
    source: str  #: the kernel's file in native/: "grid_fast.cu" (the fast path) or "grid_stream.cu" (the streaming)
    function: str  #: its kernel's name
    phases: tuple[str, ...]  #: the -DGRID_PROFILE phases, in the order the kernel sums them
    why: str = ""  #: which kernel and why, for the curious (and the tests)


def _options(config: EngineConfig, x_dtype, ctas: int, smem: int, scratch: int, extra: tuple[str, ...] = ()):
    """The NVRTC -D options both grid kernels take (their layouts check GRID_SMEM and GRID_SCRATCH), then `extra`,
    then -DGRID_PROFILE where Tuning.grid_profile asks for it."""
    model, sizes = config.model, tuple(config.model.sizes)
    return (
        (
            "-std=c++17",
            f"-DGRID_NL={len(sizes) - 1}",
            f"-DGRID_SIZES={{{','.join(str(s) for s in sizes)}}}",
            f"-DGRID_OFFS={{{','.join(str(o) for o in param_layout(model).offsets)}}}",
            f"-DGRID_P={ctas}",
            f"-DGRID_B={config.batch_size}",
            f"-DGRID_NT={THREADS}",
            f"-DGRID_XIN={0 if np.dtype(x_dtype) == np.uint8 else 1}",
            f"-DGRID_PREC={_PREC[config.precision]}",
            f"-DGRID_ACT={0 if model.activation == 'relu' else 1}",
            f"-DGRID_OPT={config.optimizer.kernel_params().kind}",
            f"-DGRID_NS={len(config.optimizer.state_names)}",
            f"-DGRID_SMEM={smem}",
            f"-DGRID_SCRATCH={scratch}",
            f"-DGRID_LOSS={describe(config.loss).kind}",  # native/loss.cuh's LOSS_ kind
        )
        + extra
        + (("-DGRID_PROFILE",) if config.tuning.grid_profile else ())
    )


def fast_smem_bytes(features: int, hidden: int, n_state: int, state_in_l2: bool = False, x_bytes: int = 1) -> int:
    """Shared memory of one CTA of native/grid_fast.cu, as its make_smem(): the batch (two stages), the activation
    tile, the CTA's fp16 weight rows, the cross-warp sums, the own activation tiles, biases / W3 slice / logits /
    dlogits / row sums (and their optimizer state), labels and indices, profile, the W0 and W2 masters (and their
    `n_state` state arrays, unless `state_in_l2` puts them in the global scratch), the mbarriers. `x_bytes`: staged
    bytes a feature (1 for uint8 rows, 2 for float32 rows converted to fp16)."""
    rows, nb, nw = FAST_MAX_BATCH, UNITS_PER_CTA, THREADS // 32
    o = 2 * rows * features * x_bytes + hidden * rows * 2 + nb * hidden * 2 + 8 * 16 * 40 * 4 + 4 * rows * nb * 2
    o += (3 * nb + 16 + 16 * nb + 2 * rows * 16 + 2 * nw * nb) * 4 + n_state * (3 * nb + 16 + 16 * nb) * 4
    o += 3 * rows * 4 + 16 * 8
    o += (features // 16 + hidden // 16) * 512 * (1 + (0 if state_in_l2 else n_state))
    return o + 3 * 8


def fast_scratch_bytes(hidden: int, features: int = 0, n_state: int = 0, state_in_l2: bool = False) -> int:
    """Global scratch of native/grid_fast.cu, as its make_scratch(): the fp16 rows of W1 and W2 in fragment order,
    W3's two fp16 operand copies by step parity, the four exchange buffers (H0, H1, H2, dZ1) and, with
    `state_in_l2`, each CTA's `n_state` optimizer-state arrays of its W0 rows and W1, W2 columns."""
    up128 = lambda a: -(-a // 128) * 128  # noqa: E731
    rows = FAST_MAX_BATCH
    return (
        2 * up128(2 * hidden * hidden)
        + up128(2 * 2 * hidden // 16 * 256)
        + up128(2 * 2 * hidden // 8 * 128)
        + 4 * up128(2 * hidden * rows)
        + (hidden // UNITS_PER_CTA * n_state * (features // 16 + 2 * hidden // 16) * 512 if state_in_l2 else 0)
    )


def _tensor_core_shape(config: EngineConfig) -> str | None:
    """Why neither tensor-core kernel (grid_fast.cu, grid_stream.cu) serves the model's depth or widths, or None:
    other than three hidden layers, or unequal ones."""
    sizes = tuple(config.model.sizes)
    if len(sizes) != 5:
        return f"{len(sizes) - 2} hidden layers (it trains three)"
    if sizes[2] != sizes[1] or sizes[3] != sizes[1]:
        return f"hidden widths {list(sizes[1:-1])} (it takes three equal ones)"
    return None


def _tensor_core_math(config: EngineConfig) -> str | None:
    """Why neither tensor-core kernel computes the model's arithmetic, or None: "mixed", ReLU, cross-entropy only."""
    if config.precision != "mixed":
        return f'precision {config.precision!r} (it trains "mixed": fp32 masters, fp16 tensor-core operands)'
    if config.model.activation != "relu":
        return f"activation {config.model.activation!r} (it takes relu)"
    if describe(config.loss).kind != KIND_XENT:  # native/loss.cuh says why not MSE
        return f"loss {config.loss!r} (it computes softmax cross-entropy)"
    return None


def _tensor_core_head(config: EngineConfig) -> str | None:
    """Why neither tensor-core kernel's head and step hold the classes and the batch, or None."""
    classes, batch = config.model.sizes[-1], config.batch_size
    if not 2 <= classes <= FAST_MAX_CLASSES:
        return f"{classes} classes (it takes 2 to {FAST_MAX_CLASSES}: one m16 tile of logits)"
    if batch > FAST_MAX_BATCH:
        return f"batch size {batch} (it takes up to {FAST_MAX_BATCH} rows a step)"
    return None


def fast_plan(
    config: EngineConfig, x_dtype: np.dtype | type, sm_count: int = HOPPER_SMS, smem_limit: int = HOPPER_SMEM
) -> GridPlan | str:
    """native/grid_fast.cu's plan for `config`, or why the fast path does not serve it."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    reason = _tensor_core_shape(config)
    if reason is not None:
        return reason
    hidden = sizes[1]
    if hidden % FAST_UNIT_STEP or hidden // UNITS_PER_CTA > sm_count:
        most = UNITS_PER_CTA * sm_count // FAST_UNIT_STEP * FAST_UNIT_STEP
        return f"a hidden width of {hidden} (it takes multiples of {FAST_UNIT_STEP} up to {most}: 8 units a CTA)"
    reason = _tensor_core_math(config)
    if reason is not None:
        return reason
    xf = np.dtype(x_dtype) != np.uint8  # float32 rows: staged as fp16 operands, 2 bytes a feature
    features = sizes[0]
    if features % 16:
        return f"{features} input features (it takes multiples of 16: 16-byte row copies)"
    reason = _tensor_core_head(config)
    if reason is not None:
        return reason
    kernel = opt.kernel_params()
    n_state = len(opt.state_names)
    if kernel.kind not in (KIND_SGD, KIND_ADAMW):
        return f"optimizer kind {kernel.kind} (it takes SGD and AdamW)"
    if config.normalize is not None and (np.ndim(config.normalize[0]) or np.ndim(config.normalize[1])):
        return "normalize is per-feature (it takes two numbers)"
    xb = 2 if xf else 1
    need = fast_smem_bytes(features, hidden, n_state, False, xb)
    # no room on chip for the optimizer state (shared memory for W0's and W2's, registers for W1's: at most 32 a
    # lane): the CTA's private region of L2
    momg = n_state >= 1 and (need > smem_limit or n_state * hidden // FAST_UNIT_STEP > 8)
    if momg:
        need = fast_smem_bytes(features, hidden, n_state, True, xb)
    if need > smem_limit:
        return f"it needs {need:,} bytes of shared memory per CTA, over the GPU's {smem_limit:,}"
    _, shift = input_affine(x_dtype, config.normalize)
    ctas = hidden // UNITS_PER_CTA
    scratch = fast_scratch_bytes(hidden, features, n_state, momg)
    shifted = int(float(shift) != 0.0 and not xf)  # float rows take the shift in their conversion
    options = _options(config, x_dtype, ctas, need, scratch, (f"-DGRID_SHIFT={shifted}", f"-DGRID_MOMG={int(momg)}"))
    why = (f"grid_fast.cu: {ctas} CTAs of {UNITS_PER_CTA} units, masters on chip ({need:,} bytes of shared memory a "
           f"CTA), {FAST_MAX_BATCH} rows a step" + (", optimizer state in L2" if momg else ""))  # fmt: skip
    return GridPlan(ctas=ctas, units=(UNITS_PER_CTA,) * 3, threads=THREADS, smem_bytes=need, scratch_bytes=scratch,
                    rounds=rounds_per_step(3), options=options, source="grid_fast.cu", function="grid_fast_kernel",
                    why=why, phases=FAST_PHASES)  # fmt: skip


def stream_smem_bytes(features: int, hidden: int, units_per_cta: int, n_state: int = 0) -> int:
    """Shared memory of one CTA of native/grid_stream.cu, as its make_smem(): the batch (two stages of uint8 rows),
    the ring's three activation and three weight stages, the cross-warp sums, the own activation tiles, biases / b3 /
    W3 slice / logits / dlogits (and the momentum of the biases, b3 and the W3 slice), labels, profile, the
    mbarriers."""
    rows, nb, stages, nw, chunk = FAST_MAX_BATCH, units_per_cta, 3, THREADS // 32, stream_chunk(units_per_cta)
    o = 2 * rows * features + stages * chunk * rows * 2 + stages * nb * chunk * 2
    o += max(8 * 16 * 40, nw * rows * (nb + 8)) * 4 + 4 * rows * nb * 2
    o += (3 * nb + 16 + 16 * nb + 2 * rows * 16) * 4 + n_state * (3 * nb + 16 + 16 * nb) * 4
    o += 2 * rows * 4 + 16 * 8
    return o + (2 + stages) * 8


def stream_scratch_bytes(features: int, hidden: int, n_state: int = 0) -> int:
    """Global scratch of native/grid_stream.cu, as its make_scratch(): the fp32 masters of W0, W1, W2 in their
    owners' fragment order, the fp16 rows of W1 and W2, W3's two fp16 operand copies by step parity, the four exchange
    buffers (H0, H1, H2, dZ1), and with momentum (`n_state` 1) its buffers of W0, W1, W2 beside the masters."""
    up128 = lambda a: -(-a // 128) * 128  # noqa: E731
    rows = FAST_MAX_BATCH
    masters = up128(4 * hidden * features) + 2 * up128(4 * hidden * hidden)
    return (
        masters * (1 + n_state)
        + 2 * up128(2 * hidden * hidden)
        + up128(2 * 2 * hidden // 16 * 256)
        + up128(2 * 2 * hidden // 8 * 128)
        + 4 * up128(2 * hidden * rows)
    )


def stream_plan(
    config: EngineConfig, x_dtype: np.dtype | type, sm_count: int = HOPPER_SMS, smem_limit: int = HOPPER_SMEM
) -> GridPlan | str:
    """native/grid_stream.cu's plan for `config`, or why the streaming path does not serve it."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    reason = _tensor_core_shape(config)
    if reason is not None:
        return reason
    hidden = sizes[1]
    fits = [nb for nb in STREAM_UNITS if hidden % stream_chunk(nb) == 0 and hidden // nb <= sm_count
            and hidden // stream_chunk(nb) >= STREAM_STAGES]  # fmt: skip
    if not fits:
        return (f"a hidden width of {hidden} (it takes h / NB CTAs within the {sm_count} SMs at NB = 16, 32 or 64 "
                f"units a CTA, h a multiple of {STREAM_CHUNK}, or of {stream_chunk(64)} at 64, in at least "
                f"{STREAM_STAGES} such chunks)")  # fmt: skip
    reason = _tensor_core_math(config)
    if reason is not None:
        return reason
    if np.dtype(x_dtype) != np.uint8:
        return f"{np.dtype(x_dtype)} inputs (it takes uint8 rows)"
    features = sizes[0]
    if features % 16 or features > STREAM_MAX_FEATURES:
        return f"{features} input features (it takes multiples of 16 up to {STREAM_MAX_FEATURES})"
    reason = _tensor_core_head(config)
    if reason is not None:
        return reason
    kernel = opt.kernel_params()
    n_state = len(opt.state_names)
    if kernel.kind != KIND_SGD:
        return f"optimizer {type(opt).__name__} (it takes SGD, with or without momentum)"
    if config.normalize is not None and (np.ndim(config.normalize[0]) or np.ndim(config.normalize[1])):
        return "normalize is per-feature (it takes two numbers)"
    _, shift = input_affine(x_dtype, config.normalize)
    if float(shift) != 0.0:
        return f"a normalize shift of {float(shift):g} (it takes a scale only)"
    nb = fits[0]
    if nb == 64 and n_state:
        return f"SGD momentum at {hidden} (64 units a CTA: its buffers' registers would spill)"
    ctas = hidden // nb
    need = stream_smem_bytes(features, hidden, nb, n_state)
    if need > smem_limit:
        return f"it needs {need:,} bytes of shared memory per CTA, over the GPU's {smem_limit:,}"
    scratch = stream_scratch_bytes(features, hidden, n_state)
    if scratch > MAX_SCRATCH:
        return f"it needs {scratch:,} bytes of global scratch, over the grid kernel's {MAX_SCRATCH:,}"
    options = _options(config, x_dtype, ctas, need, scratch)
    why = (f"grid_stream.cu: {ctas} CTAs of {nb} units, masters in HBM ({scratch:,} bytes of global scratch, "
           f"{need:,} bytes of shared memory a CTA), {FAST_MAX_BATCH} rows a step")  # fmt: skip
    return GridPlan(ctas=ctas, units=(nb,) * 3, threads=THREADS, smem_bytes=need, scratch_bytes=scratch,
                    rounds=rounds_per_step(3), options=options, source="grid_stream.cu",
                    function="grid_stream_kernel", why=why, phases=STREAM_PHASES)  # fmt: skip


def grid_plan(
    config: EngineConfig, x_dtype: np.dtype | type, sm_count: int = HOPPER_SMS, smem_limit: int = HOPPER_SMEM
) -> GridPlan | str:
    """The plan for `config` with inputs of `x_dtype` on a GPU of `sm_count` SMs and `smem_limit` bytes of shared
    memory per CTA: the fast kernel where `fast_plan` serves the model, else the streaming kernel where `stream_plan`
    does, else why neither does (naming each one's limit, and engine='graph', which trains every model). The generic
    version 1 (grid.cu) is gone from native/: it was 14-122x slower than the graph engine wherever it ran. Both
    kernels are written for layers of at most MAX_WIDTH: that limit is checked once, here. Every model served with
    float32 rows is served with uint8 rows too (the fast kernel stages a float32 feature in 2 bytes, a uint8 one in 1;
    the streaming kernel takes uint8 rows only)."""
    sizes = tuple(config.model.sizes)
    if len(sizes) < 3:
        return "no hidden layer to spread; use engine='fused' or 'graph'"
    widest = max(sizes)
    if widest > MAX_WIDTH:
        return f"a layer of {widest} is wider than the grid kernels' {MAX_WIDTH}; use engine='graph'"
    fast = fast_plan(config, x_dtype, sm_count, smem_limit)
    if isinstance(fast, GridPlan):
        return fast
    stream = stream_plan(config, x_dtype, sm_count, smem_limit)
    if isinstance(stream, GridPlan):
        return stream
    if fast == stream:  # a limit both share (depth, widths, precision, activation, loss, classes, batch)
        return f"{fast}; use engine='graph'"
    return f"grid_fast.cu: {fast}; grid_stream.cu: {stream}; use engine='graph'"
