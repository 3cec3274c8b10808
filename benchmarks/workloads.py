"""The benchmark's plan: workloads, contenders, the shared protocol, data and environment facts. No torch here.

Protocol, the same for every contender: build from `fastnn._model.init_parameters(model, SEED)`, run one
warm-up epoch on epoch 0's order (compilation, capture, NVRTC, plans: reported as setup), restore the
initial weights, then time epochs 1..E, each in `fastnn._shuffle.permutation(SEED, epoch, n)`'s order.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fastnn
from fastnn._shuffle import permutation

__all__ = [
    "CONTENDERS",
    "FIRST_TIMED_EPOCH",
    "LOSS_WORKLOADS",
    "SEED",
    "Contender",
    "Workload",
    "all_workloads",
    "batch_grid",
    "build_workloads",
    "compile_kwargs",
    "environment",
    "epoch_orders",
    "load_data",
    "select",
    "settings",
    "tta_workloads",
    "workload_groups",
    "write_json",
    "write_text",
]

SEED = 0
#: Epoch 0 is everybody's warm-up epoch; the timed epochs are 1..E (the shuffle is keyed by the absolute epoch).
FIRST_TIMED_EPOCH = 1
HIDDEN_FULL = (128, 256, 512, 1024, 2048, 4096, 8192)
HIDDEN_QUICK = (128, 1024)
#: Workloads whose torch rows keep every step's loss (the loss graph draws them).
LOSS_WORKLOADS = ("logreg", "mlp-128")
#: MLP: 5,000 steps of batch 32 = 5 epochs over the first 32,000 training samples (no short last batch).
MLP_SAMPLES = 32_000
MLP_BATCH = 32
#: Larger batches at h = 1024 (issue 27), where cuBLASLt's GEMMs are efficient and the persistent engines may not
#: win: (hidden, batch, epochs) over the same 32,000 samples. Batch 128: 250 steps x 20 epochs = 5,000 steps, as
#: the batch-32 MLPs; batch 1024: 32 steps (the last of 256 samples) x 40 epochs = 1,280 steps (~0.2-0.4 s timed
#: on an H100, long enough for the wall clock).
BATCH_VARIANTS = ((1024, 128, 20), (1024, 1024, 40))
#: The batch grid (issue 44): batch 64, 128, 256 and 512 at h = 256, 1024 and 4096, over the same 32,000 samples.
#: Epochs per batch: 2,500 steps at batch 64 and 128, ~1,250 at 256 and 512 (h = 4096 at batch 512 in fp32 without
#: TF32 is ~2 ms a step on an H100: ~3 s a row); BATCH_VARIANTS' (1024, 128) keeps its 20 epochs, so the committed
#: run's mlp-1024-b128 is the same workload.
GRID_HIDDEN = (256, 1024, 4096)
GRID_BATCHES = (64, 128, 256, 512)
GRID_EPOCHS = {64: 5, 128: 10, 256: 10, 512: 20}


@dataclass(frozen=True)
class Workload:
    """One training job that every contender runs: model sizes, optimizer, batch, data size, epochs."""

    name: str
    sizes: tuple[int, ...]
    lr: float
    batch_size: int
    samples: int  #: the first `samples` rows of the training set
    epochs: int
    hidden: int | None = None  #: the MLP's hidden width, None for logistic regression
    optimizer: str = "sgd"  #: "sgd" (plain) or "adamw"
    weight_decay: float = 0.0  #: AdamW's decoupled weight decay
    normalize: tuple[float, float] | None = None  #: fastnn's `normalize=` (mean, std) after scaling by 1/255
    target_accuracy: float | None = None  #: time-to-accuracy workloads: the test accuracy to reach

    def fastnn_optimizer(self) -> fastnn.SGD | fastnn.AdamW:
        """The optimizer every contender mirrors (torch.optim and JAX implement the same rule)."""
        if self.optimizer == "adamw":
            return fastnn.AdamW(lr=self.lr, weight_decay=self.weight_decay)
        return fastnn.SGD(lr=self.lr)

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.samples // self.batch_size)  # fastnn's default drop_last=False: the short batch counts

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def batch_sizes(self) -> list[int]:
        """Samples in each step of one epoch (the last one may be short)."""
        return [min(self.batch_size, self.samples - s * self.batch_size) for s in range(self.steps_per_epoch)]


@dataclass(frozen=True)
class Contender:
    """One way of training: a family (fastnn, torch, numpy), a precision and how it runs."""

    name: str
    family: str  #: "fastnn" (GPU engine), "numpy" (fastnn's NumPy engine on the CPU), "torch" or "jax"
    precision: str  #: fastnn: "mixed" | "fp16" | "fp32"; torch, jax: "fp32" | "amp"
    kind: str  #: torch: "eager" | "compile" | "graph"; fastnn/numpy: "trainer"; jax: "scan"
    description: str
    logreg_only: bool = False
    engine: str = "auto"  #: fastnn: Trainer(engine=...) ("auto" | "graph" | "fused")
    xla_flags: str = ""  #: jax: XLA_FLAGS of its subprocess (set before jax initialises)
    workloads: tuple[str, ...] | None = None  #: only these workloads (None: all)
    #: fp32 matmuls. torch: torch.set_float32_matmul_precision's value ("highest": no TF32; "high": TF32, the same
    #: as torch.backends.cuda.matmul.allow_tf32 = True); jax: "highest" (Precision.HIGHEST) or "default" (no
    #: precision argument, JAX's default: TF32 on Ampere and later GPUs).
    matmul_precision: str = "highest"
    compile_mode: str = ""  #: torch kind "compile": torch.compile's mode ("max-autotune", "default")


#: torch.compile's other arguments, the same for every compile contender (the compile kind reads them from here).
TORCH_COMPILE_OPTIONS: dict[str, Any] = {"fullgraph": True, "dynamic": False}
#: JAX's fp32 dot precisions by `Contender.matmul_precision` (None: no `precision=` argument, JAX's default).
JAX_DOT_PRECISION = {"highest": "HIGHEST", "default": None}
#: torch.set_float32_matmul_precision's values and what they mean for fp32 matmuls on the GPU.
TORCH_MATMUL = {"highest": "no TF32", "high": "TF32", "medium": "bf16"}


def compile_kwargs(contender: Contender) -> dict[str, Any]:
    """torch.compile's keyword arguments for a compile contender (mode and TORCH_COMPILE_OPTIONS)."""
    if not contender.compile_mode:
        raise ValueError(f"{contender.name} is not a torch.compile contender (no compile_mode)")
    return {"mode": contender.compile_mode, **TORCH_COMPILE_OPTIONS}


def settings(contender: Contender) -> str:
    """The contender's settings as its user writes them, made from its definition (the fields the runners read):
    the settings column of bench.md and the docs."""
    c = contender
    if c.family == "numpy":
        return 'fastnn.Trainer(device="cpu") (NumPy engine, fp32)'
    if c.family == "fastnn":
        return f'fastnn.Trainer(precision="{c.precision}", engine="{c.engine}")'
    if c.family == "torch":
        if c.matmul_precision not in TORCH_MATMUL:
            raise ValueError(f"{c.name}: unknown torch matmul_precision {c.matmul_precision!r}")
        run = {
            "eager": "eager loop, torch.optim.SGD (foreach)",
            "graph": "one torch.cuda.CUDAGraph per epoch of whole steps",
        }.get(c.kind) or "torch.compile(" + ", ".join(f"{k}={v!r}" for k, v in compile_kwargs(c).items()) + ")"
        prec = 'torch.autocast("cuda", torch.float16), no GradScaler' if c.precision == "amp" else "fp32"
        matmul = f'torch.set_float32_matmul_precision("{c.matmul_precision}") ({TORCH_MATMUL[c.matmul_precision]})'
        return f"{run}; {prec}; {matmul}"
    if c.family == "jax":
        if c.matmul_precision not in JAX_DOT_PRECISION:
            raise ValueError(f"{c.name}: unknown jax matmul_precision {c.matmul_precision!r}")
        if c.precision == "amp":
            prec = "fp16 dot operands, preferred_element_type=float32, fp32 weights"
        elif JAX_DOT_PRECISION[c.matmul_precision] is None:
            prec = "fp32, dot without precision= (JAX's default: TF32 on Ampere and later)"
        else:
            prec = f"fp32, dot precision=lax.Precision.{JAX_DOT_PRECISION[c.matmul_precision]} (no TF32)"
        flags = f"XLA_FLAGS={c.xla_flags}" if c.xla_flags else "default XLA flags"
        return f"jax.jit(lax.scan) per epoch; {prec}; {flags}"
    raise ValueError(f"{c.name}: unknown family {c.family!r}")


#: XLA command buffers (CUDA graphs) for every command type, loops (WHILE: the scan) and conditionals included,
#: down to single-op graphs.
XLA_CMDBUF = (
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE "
    "--xla_gpu_graph_min_graph_size=1"
)

#: The XLA flag variants run on the widths the closing note quotes (issue 11 found the flags made no difference).
FLAG_WORKLOADS = ("logreg", "mlp-128", "mlp-1024", "mlp-8192")

#: fastnn's GPU engines, each also a contender of its own in every precision (fastnn-ENGINE is mixed): the fused
#: engine refuses fp32 and the grid engine fp16 and fp32 (EngineRefused: the row is "unavailable" with the reason).
ENGINES = ("graph", "fused", "grid")

CONTENDERS = (
    Contender("fastnn-mixed", "fastnn", "mixed", "trainer", "fastnn, fp16 operands, fp32 accumulation and weights"),
    Contender("fastnn-fp16", "fastnn", "fp16", "trainer", "fastnn, fp16 weights and compute"),
    Contender("fastnn-fp32", "fastnn", "fp32", "trainer", "fastnn, fp32 everywhere (no TF32)"),
    Contender("torch-eager-fp32", "torch", "fp32", "eager", "PyTorch eager, fp32, TF32 off"),
    Contender("torch-eager-amp", "torch", "amp", "eager", "PyTorch eager, fp16 autocast, no GradScaler"),
    Contender(
        "torch-compile-amp",
        "torch",
        "amp",
        "compile",
        'torch.compile(mode="max-autotune", fullgraph=True), fp16 autocast, the seeds\' setting (fullgraph=True: a '
        "graph break is an error, not a silent fallback to eager; the row then fails and says why)",
        compile_mode="max-autotune",
    ),
    Contender(
        "torch-compile-default-amp",
        "torch",
        "amp",
        "compile",
        "torch.compile in its default mode (fullgraph=True), fp16 autocast",
        compile_mode="default",
    ),
    Contender("torch-graph-fp32", "torch", "fp32", "graph", "PyTorch, one CUDA graph per epoch of whole steps, fp32"),
    Contender(
        "torch-graph-tf32",
        "torch",
        "fp32",
        "graph",
        "PyTorch, one CUDA graph per epoch of whole steps, fp32 with TF32 matmuls",
        matmul_precision="high",
    ),
    Contender(
        "torch-graph-amp", "torch", "amp", "graph", "PyTorch, one CUDA graph per epoch of whole steps, fp16 autocast"
    ),
    Contender("numpy-cpu", "numpy", "fp32", "trainer", "fastnn's NumPy engine on the CPU", logreg_only=True),
    Contender(
        "fastnn-graph", "fastnn", "mixed", "trainer", 'fastnn engine="graph" (CUDA graph), mixed', engine="graph"
    ),
    Contender(
        "fastnn-fused", "fastnn", "mixed", "trainer", 'fastnn engine="fused" (persistent kernel), mixed', engine="fused"
    ),
    Contender(
        "fastnn-grid", "fastnn", "mixed", "trainer", 'fastnn engine="grid" (one kernel over every SM), mixed',
        engine="grid",
    ),
    *(
        Contender(f"fastnn-{e}-{p}", "fastnn", p, "trainer", f'fastnn engine="{e}", {p}', engine=e)
        for e in ENGINES
        for p in ("fp16", "fp32")
    ),
    Contender(
        "jax-default",
        "jax",
        "fp32",
        "scan",
        "JAX as most people write it: fp32 arrays, the default matmul precision",
        matmul_precision="default",
    ),
    Contender("jax-fp32", "jax", "fp32", "scan", "JAX, one jit(lax.scan) per epoch, fp32 (highest precision)"),
    Contender("jax-amp", "jax", "amp", "scan", "JAX, one jit(lax.scan) per epoch, fp16 operands, fp32 accumulation"),
    Contender(
        "jax-fp32-cmdbuf",
        "jax",
        "fp32",
        "scan",
        "jax-fp32 with XLA command buffers incl. WHILE, min size 1",
        xla_flags=XLA_CMDBUF,
        workloads=FLAG_WORKLOADS,
    ),
    Contender(
        "jax-fp32-nocmdbuf",
        "jax",
        "fp32",
        "scan",
        "jax-fp32 with XLA command buffers off",
        xla_flags="--xla_gpu_enable_command_buffer=",
        workloads=FLAG_WORKLOADS,
    ),
)
GROUPS = {
    "fastnn": [c.name for c in CONTENDERS if c.family == "fastnn"],
    "torch": [c.name for c in CONTENDERS if c.family == "torch"],
    "numpy": ["numpy-cpu"],
    "jax": [c.name for c in CONTENDERS if c.family == "jax"],
}


def build_workloads(quick: bool) -> list[Workload]:
    """Issue 3's workloads and issue 27's larger batches at h = 1024; `quick` keeps two hidden sizes at batch 32,
    3 logreg epochs and 1 MLP epoch (1,000 steps)."""
    logreg = Workload("logreg", (784, 10), lr=0.1, batch_size=128, samples=60_000, epochs=3 if quick else 20)
    mlps = [
        Workload(
            f"mlp-{h}",
            (784, h, h, h, 10),
            lr=0.003,
            batch_size=MLP_BATCH,
            samples=MLP_SAMPLES,
            epochs=1 if quick else 5,
            hidden=h,
        )
        for h in (HIDDEN_QUICK if quick else HIDDEN_FULL)
    ]
    batches = [
        Workload(f"mlp-{h}-b{b}", (784, h, h, h, 10), lr=0.003, batch_size=b, samples=MLP_SAMPLES, epochs=e, hidden=h)
        for h, b, e in ([] if quick else BATCH_VARIANTS)
    ]
    return [logreg, *mlps, *batches]


def batch_grid() -> list[Workload]:
    """The batch grid: MLP 784-h-h-h-10 at every (GRID_HIDDEN, GRID_BATCHES), SGD lr 0.003, 32,000 samples."""
    epochs = {(h, b): e for h, b, e in BATCH_VARIANTS}
    return [
        Workload(f"mlp-{h}-b{b}", (784, h, h, h, 10), lr=0.003, batch_size=b, samples=MLP_SAMPLES,
                 epochs=epochs.get((h, b), GRID_EPOCHS[b]), hidden=h)  # fmt: skip
        for h in GRID_HIDDEN
        for b in GRID_BATCHES
    ]


def all_workloads(quick: bool) -> list[Workload]:
    """Every workload `--only-workload` can name: build_workloads' (the default run) and, in full runs, the batch
    grid."""
    default = build_workloads(quick)
    names = {w.name for w in default}
    return default + ([] if quick else [w for w in batch_grid() if w.name not in names])


#: Time to accuracy (issue 11): MLP 784-256-256-10, AdamW, on all 60,000 training images; test accuracy checked
#: at each epoch end; the run stops at the first epoch that reaches the target or after `epochs` epochs.
TTA_TARGET = 0.89
#: Checked on the CPU (fastnn's NumPy engine, README): test accuracy 0.8416, 0.8449, 0.8649, 0.8738, 0.8755, 0.8734,
#: 0.8769, 0.8757, 0.8875, 0.8843, 0.8922 after epochs 1..11: first at 89% after 11 epochs. (lr 2e-3 batch 256
#: and lr 1e-3 batch 64 with normalised inputs stayed below 0.8890 for 12 epochs.)
TTA_LR = 1e-3
TTA_BATCH = 128
TTA_NORMALIZE: tuple[float, float] | None = None
TTA_MAX_EPOCHS = 20


def tta_workload() -> Workload:
    """The time-to-accuracy job; its settings were checked on the CPU with fastnn's NumPy engine (README)."""
    return Workload("tta-mlp-256", (784, 256, 256, 10), lr=TTA_LR, batch_size=TTA_BATCH, samples=60_000,
                    epochs=TTA_MAX_EPOCHS, optimizer="adamw", weight_decay=0.01, normalize=TTA_NORMALIZE,
                    target_accuracy=TTA_TARGET)  # fmt: skip


#: The seeds' time to accuracy (issue 44, cuda-mnist's style): wall clock from a fresh process, set-up included, to
#: a fixed test accuracy on Fashion-MNIST. logreg: the benchmark's logreg (SGD lr 0.1, batch 128, all 60,000 images)
#: to 0.84 (the committed run's 20 epochs end at 0.8418). mlp-128: 784-128-128-128-10 at batch 32 on all 60,000
#: images to 0.88, with SEED_TTA_MLP_OPTIMIZER (the benchmark's SGD lr 0.003 is at 0.70 after 5,000 steps: far too
#: slow for a time-to-accuracy run). Checked on the CPU with fastnn's NumPy engine (seed 0, fastnn's shuffle): AdamW
#: lr 1e-3, weight decay 0.01 gave test accuracy 0.8495, 0.8544, 0.8678, 0.8746, 0.8800 after epochs 1-5 (SGD lr 0.05:
#: 0.7995, 0.8493, 0.8544, 0.8586, 0.8532, so it stays below 0.88 far longer).
SEED_TTA_MAX_EPOCHS = 40
SEED_TTA_MLP_OPTIMIZER = "adamw"
SEED_TTA_MLP_LR = 1e-3


def tta_workloads() -> list[Workload]:
    """Every time-to-accuracy job: the seeds' (logreg to 0.84, MLP-128 to 0.88) and tta_workload() (MLP-256 to
    0.89, AdamW)."""
    logreg = Workload("tta-logreg", (784, 10), lr=0.1, batch_size=128, samples=60_000, epochs=SEED_TTA_MAX_EPOCHS,
                      target_accuracy=0.84)  # fmt: skip
    mlp = Workload("tta-mlp-128", (784, 128, 128, 128, 10), lr=SEED_TTA_MLP_LR, batch_size=MLP_BATCH,
                   samples=60_000, epochs=SEED_TTA_MAX_EPOCHS, hidden=128, optimizer=SEED_TTA_MLP_OPTIMIZER,
                   weight_decay=0.01 if SEED_TTA_MLP_OPTIMIZER == "adamw" else 0.0, target_accuracy=0.88)  # fmt: skip
    return [logreg, mlp, tta_workload()]


def _split(spec: str | None) -> list[str] | None:
    return None if spec is None else [s.strip() for s in spec.split(",") if s.strip()]


def select(
    only: str | None, only_workload: str | None, skip_compile: bool, quick: bool
) -> tuple[list[Contender], list[Workload]]:
    """The contenders and workloads a run covers; `only`/`only_workload` are comma lists (groups and "mlp" allowed).

    Raises:
        SystemExit: an unknown name, with the known ones.
    """
    names = [c.name for c in CONTENDERS]
    chosen = names
    if (wanted := _split(only)) is not None:
        chosen = []
        for w in wanted:
            if w not in names and w not in GROUPS:
                raise SystemExit(f"--only: unknown contender {w!r}; known: {', '.join(names + list(GROUPS))}")
            chosen += GROUPS.get(w, [w])
    if skip_compile:
        chosen = [c.name for c in CONTENDERS if c.name in chosen and c.kind != "compile"]
    contenders = [c for c in CONTENDERS if c.name in chosen]
    workloads = build_workloads(quick)
    if (wanted := _split(only_workload)) is not None:
        everything = all_workloads(quick)
        known = [w.name for w in everything]
        groups = workload_groups(quick)
        keep = set()
        for w in wanted:
            if w in groups:
                keep |= set(groups[w])
            elif w in known:
                keep.add(w)
            else:
                raise SystemExit(f"--only-workload: unknown workload {w!r}; known: {', '.join(known + list(groups))}")
        workloads = [w for w in everything if w.name in keep]
    return contenders, workloads


def workload_groups(quick: bool) -> dict[str, list[str]]:
    """`--only-workload`'s group names: mlp (the default run's MLPs), seed (logreg and the batch-32 MLPs), batch
    (the batch grid), all (everything)."""
    default = [w.name for w in build_workloads(quick)]
    grid = [] if quick else [w.name for w in batch_grid()]
    return {
        "mlp": [n for n in default if n.startswith("mlp-")],
        "seed": [w.name for w in build_workloads(quick) if w.hidden is None or w.batch_size == MLP_BATCH],
        "batch": grid,
        "all": list(dict.fromkeys(default + grid)),
    }


def epoch_orders(workload: Workload, first_epoch: int, epochs: int) -> np.ndarray:
    """(epochs, samples) int64: fastnn's sample order of epochs first_epoch.. (the torch contenders use it too)."""
    return np.stack([permutation(SEED, first_epoch + e, workload.samples) for e in range(epochs)])


def load_data(root: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST through fastnn.datasets (no download: the GPU machine is offline): x uint8 (N, 784), y int64."""
    x_train, y_train, x_test, y_test = fastnn.datasets.load("fashion-mnist", root=root, download=False)
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # a missing library is a fact to report, not a reason to stop
        return f"n/a: {type(e).__name__}: {e}"


def _pkg(name: str) -> str:
    return _try(lambda: importlib.metadata.version(name))


def environment(with_torch: bool) -> dict[str, Any]:
    """Device, driver and library versions for bench.json; every probe that fails says why instead of raising."""

    def _driver() -> Any:
        from fastnn.cuda import driver

        return driver

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "fastnn": fastnn.__version__,
        "cuda_bindings": _pkg("cuda-bindings"),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "driver_version": _try(lambda: _driver().driver_version()),
        "device": _try(lambda: _driver().get_device(0).name),
        "compute_capability": _try(lambda: list(_driver().get_device(0).compute_capability)),
    }

    def _cublaslt() -> int:
        from fastnn.cuda import cublaslt

        return cublaslt.version()

    def _cudnn() -> int:
        from fastnn.cuda import cudnn

        return cudnn.version()

    def _nvrtc() -> list[int]:
        from fastnn.cuda import nvrtc

        return list(nvrtc.nvrtc_version())

    env.update(cublaslt=_try(_cublaslt), cudnn=_try(_cudnn), nvrtc=_try(_nvrtc))
    if with_torch:
        import torch

        env.update(
            torch=torch.__version__,
            torch_cuda=torch.version.cuda,
            torch_cudnn=_try(torch.backends.cudnn.version),
            torch_device=_try(lambda: torch.cuda.get_device_name(0)),
        )
    return env


def plan_dict(workload: Workload) -> dict[str, Any]:
    """The workload as JSON (sizes as a list)."""
    d = asdict(workload)
    d["sizes"] = list(workload.sizes)
    d["steps"] = workload.steps
    d["steps_per_epoch"] = workload.steps_per_epoch
    return d


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename), so an interrupted run never leaves half a file."""
    write_text(path, json.dumps(obj, indent=1, allow_nan=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temp file + rename), making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def finite_or_none(v: float | None) -> float | None:
    """A float for JSON, None where it is missing or not finite."""
    return None if v is None or not math.isfinite(v) else float(v)
