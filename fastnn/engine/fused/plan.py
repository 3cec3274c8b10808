"""The fused engine's plan: pure arithmetic on shapes (no GPU), so the limits are tested on the CPU.

Three kernels. `native/fused_logreg.cu` trains logistic regression (sizes [d, C]) on a cluster of S CTAs with
producer warps, register-resident master weights and mbarrier-completed exchanges (issue 25); `logreg_plan` says
where it serves (uint8 or float32 inputs, "mixed" or "fp16", cross-entropy, 2..16 classes, batches up to 128, d up
to 2,048) and mirrors its shared-memory layout. `native/fused_mlp.cu` trains MLPs of hidden layers up to 128 wide
at batches up to 32 (uint8, "mixed"/"fp16", SGD) on a cluster of S CTAs of 16 neurons each (`mlp_plan`).
`native/fused.cu` trains everything else in one cluster of 16 CTAs with everything in shared memory: this module
mirrors its layout too (each kernel checks at compile time that it needs no more than the bytes computed here),
picks the layout (standard or lean), the rows per chunk and tensor cores or FMA (within what the config's `Tuning`
allows), and says why a model cannot be held, naming the limit. `FusedPlan.why` says which kernel was chosen and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..._data import input_affine
from ..._loss import KIND_XENT, describe
from ..._optim import KIND_SGD
from ..base import EngineConfig
from ..plan import param_layout

__all__ = [
    "CLUSTER", "LOGREG_MAX_BATCH", "LOGREG_MAX_CLASSES", "LOGREG_MAX_FEATURES", "LOGREG_THREADS", "MIN_CC",
    "MLP_MAX_BATCH", "MLP_MAX_HIDDEN", "MLP_THREADS", "MMA_MIN_ROWS", "THREADS", "FusedPlan", "fused_plan",
    "logreg_cluster", "logreg_plan", "logreg_smem_bytes", "mlp_cluster", "mlp_plan", "mlp_smem_bytes", "smem_floats",
]  # fmt: skip

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

    rows: int  #: rows per chunk (R); fused_logreg.cu: the batch's rows rounded up to 16 (one chunk a step)
    cluster: int
    threads: int
    smem_bytes: int
    options: tuple[str, ...]  #: NVRTC -D options of `source`
    source: str = "fused.cu"  #: the kernel file in native/
    function: str = "fused_epoch_kernel"  #: its extern "C" entry point
    why: str = ""  #: which kernel, and why (the logistic-regression kernel's reason for declining, if it did)


# ---- native/fused_logreg.cu: logistic regression on a cluster of S CTAs (issue 25, ../shared/design/fused-v2.md) ----
#: Threads per CTA: 8 consumer warps (forward rows, softmax, weight gradient and update) and 4 producer warps (the
#: gather: one batch row per thread).
LOGREG_THREADS = 384
LOGREG_CONSUMER_WARPS = 8
#: Classes: the two 8-wide n-tiles of one mma.sync m16n8k16 pair (a class row per fragment row of the wgrad).
LOGREG_MAX_CLASSES = 16
#: Rows a step: one producer thread per row, 16 rows per consumer warp in the forward and the softmax.
LOGREG_MAX_BATCH = 128
#: 16-feature chunks a CTA holds at most: each consumer warp keeps the fp32 masters of at most 2 chunks in
#: registers (8 a lane a chunk; momentum beside them). Measured (fused-v2.md 2.2, 784 features = 49 chunks, batch
#: 128): 13 chunks a CTA (S = 4) 2.70 us a step, 25 (S = 2) 3.36-3.45, 49 (S = 1) 4.78-4.97, 7 (S = 8) 2.91-3.07;
#: so the plan takes the smallest cluster that leaves at most 16 chunks a CTA.
LOGREG_MAX_CHUNKS = 16
LOGREG_CLUSTERS = (1, 2, 4, 8)
LOGREG_MAX_FEATURES = 16 * LOGREG_MAX_CHUNKS * LOGREG_CLUSTERS[-1]
#: Gather stages (producers run this many batches ahead), most first; fewer where shared memory is short.
LOGREG_STAGES = (4, 3, 2)


def logreg_cluster(features: int) -> int | None:
    """The cluster size for `features` inputs: the smallest S leaving at most LOGREG_MAX_CHUNKS chunks a CTA."""
    chunks = _cdiv(features, 16)
    return next((s for s in LOGREG_CLUSTERS if _cdiv(chunks, s) <= LOGREG_MAX_CHUNKS), None)


def _up16(a: int) -> int:
    return _cdiv(a, 16) * 16


def logreg_smem_bytes(features: int, classes: int, cluster: int, rows: int, stages: int, adamw: bool,
                      float_inputs: bool = False, shift: bool = False) -> int:  # fmt: skip
    """Shared memory of one CTA of fused_logreg.cu in bytes: the same layout as its `Lay` (static_assert there).
    `float_inputs`: rows staged as fp16 operands (2 bytes a feature) instead of uint8; `shift`: uint8 rows with a
    nonzero normalize shift (per-warp bias-gradient partials instead of the fp32 dlogits)."""
    nch = _cdiv(_cdiv(features, 16), cluster)
    # staged row: uint8 an odd number of 16-byte chunks (conflict-free fragment loads), fp16 16 bytes past 32 a chunk
    rowb = nch * 32 + 16 if float_inputs else nch * 16 + (16 if nch % 2 == 0 else 0)
    nj = _cdiv(nch, LOGREG_CONSUMER_WARPS)
    ce = classes + (classes & 1)
    nw = LOGREG_CONSUMER_WARPS
    parts = [
        stages * rows * rowb,  # staged uint8 rows
        16 * nch * 16 * 2,  # W16: fp16 operand copy [16 classes][nch * 16 features]
        16 * (rows + 8) * 2,  # dlogits^T, fp16 [16 classes][rows + 8]
        (2 * cluster if cluster > 1 else 1) * rows * ce * 4,  # partial logits [parity][rank][row][class]
        stages * rows * 4,  # labels
        stages * rows * 4,  # sample indices
        stages * 16,  # step constants (lr, Adam's corrections, rows)
        3 * 16 * 4,  # bias and its optimizer state (replicated)
        nw * 16 * 4 if shift else 0,  # per-warp bias-gradient partials
        0 if shift else 16 * (rows + 20) * 4,  # fp32 dlogits [class][rows + 20]: the bias gradient
        nw * 16 * 4,  # per-warp column sums of W16 (a nonzero normalize shift)
        nw * 2 * 8,  # per-warp loss sum and correct count (doubles)
        2 * nw * nj * 8 * 32 * 4 if adamw else 0,  # AdamW's moments, each lane's beside its masters
        (2 * stages + 2) * 8,  # mbarriers: full and empty per stage, the exchange's two
    ]
    return sum(_up16(b) for b in parts)


def _cluster_kernel_reason(config: EngineConfig, switch: str, max_classes: int, max_batch: int) -> str | None:
    """Why a cluster kernel (fused_logreg.cu, fused_mlp.cu; `switch` its Tuning flag) does not serve `config` for
    reasons they share, or None."""
    classes = config.model.sizes[-1]
    if not getattr(config.tuning, switch):
        return f"it is switched off (Tuning({switch}=False))"
    if describe(config.loss).kind != KIND_XENT:
        return f"loss {config.loss!r} (it computes softmax cross-entropy only)"
    if config.precision not in ("mixed", "fp16"):
        return f"precision {config.precision!r} (its products take fp16 operands on tensor cores)"
    if not 2 <= classes <= max_classes:
        return f"{classes} classes (it takes 2 to {max_classes}: one pair of 8-wide MMA tiles)"
    if config.batch_size > max_batch:
        return f"batch size {config.batch_size} (it takes up to {max_batch}: one producer thread a row)"
    if config.normalize is not None and (np.ndim(config.normalize[0]) or np.ndim(config.normalize[1])):
        return "normalize is per-feature (it takes two numbers)"
    return None


def _most_stages(choices: tuple[int, ...], smem_limit: int, need: Callable[[int], int]) -> tuple[int, int] | str:
    """(stages, bytes): the most gather stages of `choices` whose layout fits `smem_limit`, or why none does."""
    for stages in choices:
        if need(stages) <= smem_limit:
            return stages, need(stages)
    return (f"it needs {need(choices[-1]):,} bytes of shared memory per CTA even with {choices[-1]} stages, over the "
            f"GPU's {smem_limit:,}")  # fmt: skip


def logreg_plan(config: EngineConfig, x_dtype: np.dtype | type, smem_limit: int = HOPPER_SMEM) -> FusedPlan | str:
    """The plan of native/fused_logreg.cu for `config`, or why that kernel does not serve it (fused.cu then does)."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    reason = _cluster_kernel_reason(config, "fused_logreg", LOGREG_MAX_CLASSES, LOGREG_MAX_BATCH)
    if reason:
        return reason
    if len(sizes) != 2:
        return "the model has a hidden layer (it trains logistic regression, sizes [d, C])"
    features, classes = sizes
    float_inputs = np.dtype(x_dtype) != np.uint8
    if float_inputs and np.dtype(x_dtype) != np.float32:
        return f"{np.dtype(x_dtype).name} inputs (it takes uint8 and float32)"
    cluster = logreg_cluster(features)
    if cluster is None:
        return f"{features} features (it takes up to {LOGREG_MAX_FEATURES}: 16 chunks of 16 on each of 8 CTAs)"
    n_state = len(opt.state_names)
    kernel = opt.kernel_params()
    adamw = kernel.kind != KIND_SGD
    rows = _cdiv(config.batch_size, 16) * 16
    # uint8 with a nonzero shift: shift * colsum(W16) joins the logits (float32 rows take it in the conversion)
    shift = float(input_affine(np.dtype(x_dtype), config.normalize)[1]) != 0.0 and not float_inputs
    fit = _most_stages(LOGREG_STAGES, smem_limit, lambda stages: logreg_smem_bytes(
        features, classes, cluster, rows, stages, adamw, float_inputs, shift))  # fmt: skip
    if isinstance(fit, str):
        return fit
    stages, need = fit
    layout = param_layout(model)
    options = (
        "-std=c++17",
        f"-DLR_D={features}",
        f"-DLR_C={classes}",
        f"-DLR_S={cluster}",
        f"-DLR_BR={rows}",
        f"-DLR_ST={stages}",
        f"-DLR_G={next(g for g in (16, 8, 4, 1) if features % g == 0)}",
        f"-DLR_BOFF={layout.offsets[1]}",
        f"-DLR_PREC={_PREC[config.precision]}",
        f"-DLR_OPT={kernel.kind}",
        f"-DLR_NS={n_state}",
        f"-DLR_XF={int(float_inputs)}",  # float32: the producers stage x * scale + shift as fp16
        f"-DLR_SHIFT={int(shift)}",
        f"-DLR_SMEM={need}",
    ) + (("-DFUSED_PROFILE",) if config.tuning.fused_profile else ())
    why = (
        f"fused_logreg.cu: {features} features in {_cdiv(features, 16)} chunks of 16 over a cluster of {cluster} "
        f"(at most {LOGREG_MAX_CHUNKS} a CTA), {rows} rows a step, {stages} gather stages, "
        f"{np.dtype(x_dtype).name} rows"
    )
    return FusedPlan(rows=rows, cluster=cluster, threads=LOGREG_THREADS, smem_bytes=need, options=options,
                     source="fused_logreg.cu", function="fused_logreg_kernel", why=why)  # fmt: skip


# ---- native/fused_mlp.cu: MLPs of narrow hidden layers at small batches (issue 25, fused-v2.md section 3) ----------
#: Threads per CTA: 8 consumer warps and 1 producer warp (a batch row a lane).
MLP_THREADS = 288
#: Rows a step (one producer lane a row; the MMA tiles hold 32 rows).
MLP_MAX_BATCH = 32
#: Each CTA owns 16 neurons of every hidden layer: hidden layers up to 16 * 8 wide on a portable cluster.
MLP_MAX_HIDDEN = 128
MLP_MAX_CLASSES = 16
#: Layer 0's masters live in the registers of the warp that owns their 16-feature chunk: at most 8 chunks a warp.
MLP_MAX_FEATURES = 16 * 8 * 8
MLP_MAX_HIDDEN_LAYERS = 6
MLP_STAGES = (3, 2)


def mlp_cluster(hidden: tuple[int, ...]) -> int | None:
    """The cluster size for hidden layers `hidden`: the smallest S whose 16 neurons a CTA cover the widest."""
    return next((s for s in LOGREG_CLUSTERS if 16 * s >= max(hidden)), None)


def mlp_smem_bytes(sizes: tuple[int, ...], cluster: int, stages: int, momentum: bool) -> int:
    """Shared memory of one CTA of fused_mlp.cu in bytes: the same layout as its `Lay` (static_assert there)."""
    nh, d, classes, s = len(sizes) - 2, sizes[0], sizes[-1], cluster
    rows, k1, sld, tld = MLP_MAX_BATCH, 16 * cluster, 24, MLP_MAX_BATCH + 8
    nchunk = _cdiv(d, 16)
    rowb = nchunk * 16 + (16 if nchunk % 2 == 0 else 0)
    ce = classes + (classes & 1)
    slot = rows * 16 * 4  # a 32 x 16 fp32 tile
    parts = [stages * rows * rowb, stages * rows * 4, stages * rows * 4, stages * 16]  # rows, labels, indices, steps
    for layer in range(nh):  # Z (fp32), dZ^T and dZ (fp16), the gathered H (fp16 [S][32][24])
        parts += [slot, 16 * tld * 2, rows * sld * 2, s * rows * sld * 2 if layer < nh - 1 else 0]
    parts.append(rows * sld * 2)  # the last hidden layer's own slice
    for _ in range(1, nh):  # W_l (l >= 1): masters, momentum, fp16 copy
        parts += [16 * k1 * 4, 16 * k1 * 4 if momentum else 0, 16 * (k1 + 8) * 2]
    parts += [1024, 1024 if momentum else 0, 1024, 16 * sld * 2]  # the last layer's slice, momentum, gradient, fp16
    parts += [64, 64, 64] * (nh + 1)  # biases, their momentum and gradients
    parts += [s * rows * ce * 4, 16 * (rows + 16) * 4, 16 * tld * 2, rows * sld * 2]  # logits, dlogits x 3
    for layer in range(1, nh):  # reduce-scatter receive (the first holds layer 0's partials too) and send
        parts += [max(s, 8) * slot if layer == nh - 1 else s * slot, s * slot]
    parts.append(0 if nh >= 2 else 8 * slot)  # layer 0's partials of the 8 warps
    parts += [8 * 2 * 8, (2 * stages + 2 * nh - 1) * 8]  # loss sums, mbarriers
    return sum(_up16(b) for b in parts)


def mlp_plan(config: EngineConfig, x_dtype: np.dtype | type, smem_limit: int = HOPPER_SMEM) -> FusedPlan | str:
    """The plan of native/fused_mlp.cu for `config`, or why that kernel does not serve it (fused.cu then does)."""
    model, opt = config.model, config.optimizer
    sizes = tuple(model.sizes)
    reason = _cluster_kernel_reason(config, "fused_mlp", MLP_MAX_CLASSES, MLP_MAX_BATCH)
    if reason:
        return reason
    hidden = sizes[1:-1]
    if not 1 <= len(hidden) <= MLP_MAX_HIDDEN_LAYERS:
        return f"{len(hidden)} hidden layers (it takes 1 to {MLP_MAX_HIDDEN_LAYERS})"
    if max(hidden) > MLP_MAX_HIDDEN:
        return f"a hidden layer of {max(hidden)} (it takes up to {MLP_MAX_HIDDEN}: 16 neurons on each of 8 CTAs)"
    if sizes[0] > MLP_MAX_FEATURES:
        return f"{sizes[0]} inputs (it takes up to {MLP_MAX_FEATURES}: layer 0's masters in registers)"
    if np.dtype(x_dtype) != np.uint8:
        return f"{np.dtype(x_dtype).name} inputs (it takes uint8)"
    if opt.kernel_params().kind != KIND_SGD:
        return f"{type(opt).__name__} (it takes SGD: AdamW's moments of layer 0 do not fit beside its rows)"
    if float(input_affine(np.uint8, config.normalize)[1]) != 0.0:
        return "normalize has a nonzero shift (it applies a scale only)"
    cluster = mlp_cluster(hidden)
    momentum = len(opt.state_names) == 1
    fit = _most_stages(MLP_STAGES, smem_limit, lambda stages: mlp_smem_bytes(sizes, cluster, stages, momentum))
    if isinstance(fit, str):
        return fit
    stages, need = fit
    layout = param_layout(model)
    options = (
        "-std=c++17",
        f"-DMP_NH={len(hidden)}",
        f"-DMP_SIZES={{{','.join(str(v) for v in sizes)}}}",
        f"-DMP_OFFS={{{','.join(str(o) for o in layout.offsets)}}}",
        f"-DMP_S={cluster}",
        f"-DMP_ST={stages}",
        f"-DMP_G={next(g for g in (16, 8, 4, 1) if sizes[0] % g == 0)}",
        f"-DMP_PREC={_PREC[config.precision]}",
        f"-DMP_NS={int(momentum)}",
        f"-DMP_ACT={0 if model.activation == 'relu' else 1}",
        f"-DMP_SMEM={need}",
    ) + (("-DFUSED_PROFILE",) if config.tuning.fused_profile else ())
    why = (f"fused_mlp.cu: {len(hidden)} hidden layers of at most {max(hidden)} on a cluster of {cluster} (16 neurons "
           f"a CTA), {stages} gather stages")  # fmt: skip
    return FusedPlan(rows=MLP_MAX_BATCH, cluster=cluster, threads=MLP_THREADS, smem_bytes=need, options=options,
                     source="fused_mlp.cu", function="fused_mlp_kernel", why=why)  # fmt: skip


def fused_plan(config: EngineConfig, x_dtype: np.dtype | type, smem_limit: int = HOPPER_SMEM) -> FusedPlan | str:
    """The plan for `config` with inputs of `x_dtype`, or a reason (naming the limit) it cannot be held: the
    logistic-regression kernel where `logreg_plan` serves the model, the MLP kernel where `mlp_plan` does, else
    native/fused.cu."""
    logreg = len(config.model.sizes) == 2
    special = (logreg_plan if logreg else mlp_plan)(config, x_dtype, smem_limit)
    if isinstance(special, FusedPlan):
        return special
    plan = _fused_cu_plan(config, x_dtype, smem_limit)
    if isinstance(plan, str):
        return plan
    return replace(plan, why=f"fused.cu, not {'fused_logreg.cu' if logreg else 'fused_mlp.cu'}: {special}")


def _fused_cu_plan(config: EngineConfig, x_dtype: np.dtype | type, smem_limit: int) -> FusedPlan | str:
    """native/fused.cu's plan, or why it cannot hold the model."""
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
        f"-DFUSED_LOSS={describe(config.loss).kind}",  # native/loss.cuh's LOSS_ kind
    ) + (("-DFUSED_PROFILE",) if tuning.fused_profile else ())
    return FusedPlan(rows=rows, cluster=CLUSTER, threads=THREADS, smem_bytes=need, options=options)
