"""`Tuning`: the engines' measured choices as data, the winners as defaults.

How an engine runs, never what it computes (up to summation order and the GEMM algorithms picked). Benchmarks and
tests pass another `Tuning` (through `EngineConfig`, or `Trainer(tuning=...)`) to compare variants; nothing patches
module state. A variant that lost its measurement leaves the product (its experiment moves to
`benchmarks/kernels/`); the data-parallel switches below were never measured on two GPUs, so they stay, off.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._errors import ConfigError

__all__ = ["FUSED_LAYOUTS", "GRID_RULE", "MANY_LOSS_KERNELS", "MANY_UPDATE_KERNELS", "GridRule", "Tuning",
           "check_tuning"]  # fmt: skip

#: The fused engine's shared-memory layouts (fused/plan.py): "standard" keeps a gradient array per weight array
#: and, in "mixed", an fp16 operand copy; "lean" keeps neither (see `Tuning.fused_layouts`).
FUSED_LAYOUTS = ("standard", "lean")
#: The many-model GPU engine's cross-entropy kernels (native/many.cu): "model" (many_xent, a block a model) and "tiled"
#: (many_xent_tiled, a block a tile of neighbouring models read with coalesced loads); the same bits.
MANY_LOSS_KERNELS = ("model", "tiled")
#: The many-model GPU engine's update kernels: "scalar" (many_update, an element a thread an iteration) and "vec4"
#: (many_update_vec, four as 16-B loads and stores); the same bits.
MANY_UPDATE_KERNELS = ("scalar", "vec4")


@dataclass(frozen=True)
class GridRule:
    """Where engine="auto" takes the grid engine (after the fused engine's rule, before the graph engine): every
    hidden layer between min_hidden and max_hidden wide, a batch of at most max_batch, one of `precisions`, an
    optimizer whose class is named in `optimizers` (and, on the streaming kernel, keeping at most `stream_states`
    state arrays)."""

    min_hidden: int
    max_hidden: int
    max_batch: int
    precisions: tuple[str, ...]
    optimizers: tuple[str, ...] = ("SGD",)
    #: the most optimizer state arrays (0: plain SGD, 1: SGD's momentum) of a model the rule gives to the streaming
    #: kernel (native/grid_stream.cu, hidden layers wider than the fast kernel's)
    stream_states: int = 0
    #: the units a CTA (grid/plan.py's stream_plan picks 16, 32 or 64) at which the rule gives it the streaming kernel
    stream_units: tuple[int, ...] = (16, 32)
    #: the fewest CTAs at which the rule gives a model the streaming kernel: its step is bytes-bound, so fewer CTAs
    #: stream at a fraction of the GPU's bandwidth (stream_plan takes h = 1152 on 18 CTAs of 64 units)
    stream_min_ctas: int = 0


#: Measured on an H100 80GB HBM3 (the lead, bench_fused.py --only sweep, 784-h-h-h-10, batch 32, mixed, SGD, the
#: graph engine in the same call): the grid engine's fast kernel (native/grid_fast.cu) ran 11.34 / 11.98 / 13.34 /
#: 17.56 us/step at h = 128 / 256 / 512 / 1024 against the graph engine's 45.82 / 48.84 / 53.40 / 64.01 (3.6-4.1x),
#: with the same test accuracy to 1e-4; its generic version 1 (native/grid.cu, since removed from native/) ran 237.7
#: at 256 and 627.5 at 1024 (0.21x, 0.10x). So engine="auto" takes the grid engine only where the fast kernel serves
#: the model: `prefer_grid` requires this range and an optimizer in `optimizers`, AND grid/plan.py's `fast_plan` (three
#: equal hidden layers, a multiple of 128 wide, "mixed", batch <= 32, SGD or AdamW) for uint8 or float32 inputs (the
#: engine is chosen before the data is seen; rows the fast kernel cannot serve, float32 at h >= 768 with 784 inputs,
#: then train with the graph engine's step).
#: At h = 128 the fused engine is faster still (fused_mlp.cu, 8.7 us/step) and its rule is asked first, so the grid
#: engine takes h = 128 where the fused engine cannot, or can only on its generic fused.cu (select.py asks
#: `fused.fast_kernel_serves`: a normalize shift or AdamW at h = 128, ~39 and 72 us/step on fused.cu against
#: ~11-12 and (at h = 256) ~38 on grid_fast.cu). A gap remains: fused_mlp.cu serves uint8 rows only, so float32
#: rows without a shift at h <= 128 still run fused.cu; the rule is decided before the data is seen. Wider than 1024
#: the fast kernel does not serve (h/8 CTAs > the SMs): see below.
#: AdamW on the fast kernel (bench_fused.py --optimizer adamw --only sweep --engines graph,grid, one H100 call): 37.8 /
#: 46.7 / 74.5 us/step at h = 256 / 512 / 1024 against the graph engine's 45.2 / 57.2 / 88.5 (1.19-1.23x; AdamW's
#: step is 3-4x SGD's on this kernel: two moments and a called element step per weight, the moments in L2 above
#: h = 384), so the rule takes AdamW too.
#: Wider than 1024 the streaming kernel (native/grid_stream.cu, masters in HBM: grid/plan.py's `stream_plan`: three
#: equal hidden layers on h / NB CTAs at NB = 16, 32 or 64 units a CTA, uint8, "mixed", batch <= 32, SGD; momentum at
#: NB <= 32) ran 55.22 / 167.12 us/step at h = 2048 / 4096 against the graph engine's 122.05 / 300.70 in the same call
#: (the lead, H100 80GB HBM3, bench_fused.py --only sweep --widths 2048,4096 --engines grid,graph: 2.21x / 1.80x,
#: the same test accuracy to 1e-4), so the range reaches 4096; `prefer_grid` still takes a model only where one of
#: the two fast kernels serves it (AdamW above 1024 stays with the graph engine; float32 rows of a model auto gave
#: the grid engine train with the graph engine's step). Between them (the lead, same GPU, a second call): 28.84 /
#: 35.01 / 105.80 us/step at h = 1280 / 1536 / 3072 against 76.15 / 90.25 / 199.42 (2.64x / 2.58x / 1.88x). With
#: momentum 0.9 (its buffers streamed beside the masters): 82.41 / 278.77 at 2048 / 4096 against the graph engine's
#: 152.40 / 409.95 (1.85x / 1.47x), so the rule gives the streaming kernel momentum too (`stream_states`). At
#: h = 8192 (64 units a CTA, 128-unit chunks; plain SGD only, momentum would spill registers there): 627.96 us/step
#: against the graph engine's 970.70 (1.55x, a third call, the same test accuracy to 1e-4), so the range reaches 8192
#: and `stream_units` takes 64. Every streaming plan measured ran on 80 CTAs or more (1280: 80 of 16; 1536 and 3072:
#: 96; 2048, 4096, 8192: 128); the plan also takes odd multiples of 128 on h / 64 CTAs (1152: 18) and, on a GPU of
#: fewer SMs, more units a CTA on fewer CTAs (4096 on 114 SMs: 64 of 64), none of them measured, so the rule asks
#: for at least 80 CTAs (`stream_min_ctas`) and leaves the rest to the graph engine.
GRID_RULE = GridRule(min_hidden=128, max_hidden=8192, max_batch=32, precisions=("mixed",), optimizers=("SGD", "AdamW"),
                     stream_states=1, stream_units=(16, 32, 64), stream_min_ctas=80)  # fmt: skip


@dataclass(frozen=True)
class Tuning:
    """The engines' measured choices; each default is the one benchmarks/NOTES.md or the README measured best."""

    #: Graph engine: heuristic candidates each cuBLASLt plan keeps; autotuning times them on the real shapes. 1 keeps
    #: cuBLASLt's first choice, so two trainers run the same algorithms (tests compare them bit for bit).
    autotune_algos: int = 16
    #: Graph engine, data-parallel: shard the optimizer update (as ZeRO stage 1). Each layer's gradient is
    #: reduce-scattered instead of all-reduced, each rank updates its part of the layer and all-gathers the part the
    #: GEMMs read, and each epoch ends by all-gathering the master weights and optimizer state, so the host finds
    #: the whole state on every rank. The update then shrinks with the world size. Off until measured on two GPUs
    #: (benchmarks/bench_scaling.py --sharded).
    sharded_update: bool = False
    #: Graph engine, data-parallel: the all-reduces' stream at the device's highest priority, so their kernels take
    #: SMs as a GEMM's blocks retire instead of queuing behind the next GEMM. Off until measured on two GPUs
    #: (bench_scaling.py --comm-priority).
    comm_high_priority: bool = False
    #: Graph engine, data-parallel: SMs the backward GEMMs leave free (cuBLASLt's SM_COUNT_TARGET) for the
    #: all-reduces beside them; NCCL's blocks otherwise wait for a GEMM's persistent grid. 0: every SM. Off until
    #: measured on two GPUs (bench_scaling.py --carveout).
    gemm_sm_carveout: int = 0
    #: `devices=` naming one GPU still builds the replica engine (a replica of one: its threads, NCCL clique and
    #: lock-step epochs without a peer), which is what one GPU can test of several. engine="fused" ignores it.
    one_gpu_replica: bool = False
    #: Fused engine: the shared-memory layouts tried in order, each at every chunk size (FUSED_LAYOUTS). "lean" (no
    #: fp16 operand copy; SGD with plain momentum folds each step's gradient into the momentum buffer) is taken
    #: only for models the standard one cannot hold; ("lean",) forces it, to test or time it.
    fused_layouts: tuple[str, ...] = FUSED_LAYOUTS
    #: Fused engine: products on tensor cores (mma.sync) in "mixed" and "fp16" at chunks of at least MMA_MIN_ROWS
    #: rows. Measured on an H100 (bench_fused.py): MLP 784-128x3-10 at 16 rows 38.4 us a step against 41.2 with
    #: scalar FMA, logistic regression at 128 rows 8.50 against 8.46. False compiles the scalar path everywhere.
    tensor_cores: bool = True
    #: Fused engine: compile native/fused.cu with -DFUSED_PROFILE: CTA 0 prints the cycles per step of each phase
    #: (bench_fused.py --phases; native/fused_logreg.cu: warp 0 of CTA 0). Benchmarks only: the printing costs time.
    fused_profile: bool = False
    #: Fused engine: logistic regression on native/fused_logreg.cu wherever fused/plan.py's `logreg_plan` serves it
    #: (issue 25: the probe's design, 2.70 us a step at 784-10, batch 128 against fused.cu's 8.4 on an H100). False
    #: keeps fused.cu for every model (to compare the two, or to test fused.cu's logistic regression).
    fused_logreg: bool = True
    #: Grid engine: compile its kernel (grid_fast.cu or grid_stream.cu) with -DGRID_PROFILE: CTA 0 sums
    #: clock64 cycles per phase into a small device array (GridTrainContext.phase_cycles reads it back). Benchmarks
    #: only.
    grid_profile: bool = False
    #: Fused engine: MLPs on native/fused_mlp.cu wherever fused/plan.py's `mlp_plan` serves them (hidden layers up to
    #: 128 wide, batches up to 32, uint8, "mixed"/"fp16", SGD; issue 25: 8.7-8.9 us a step at 784-128x3-10 on an H100).
    #: False keeps fused.cu.
    fused_mlp: bool = True
    #: Many-model GPU engine (fastnn/engine/many/gpu/): the cross-entropy kernel, one of MANY_LOSS_KERNELS. "tiled" is
    #: the variant written (without a GPU) against "model"'s ~51 us a step at K = 1,024 logistic regressions (H200,
    #: docs/design/many-models.md, "Next kernels": its budget is ~3-5 us); it computes the same bits (a GPU test pins
    #: the two together) and becomes the default only once benchmarks/bench_many.py --contenders fastnn,fastnn-next
    #: --profile measures it faster on a device. Regression (MSE) keeps many_mse either way.
    many_loss_kernel: str = "model"
    #: Many-model GPU engine: the update kernel, one of MANY_UPDATE_KERNELS. "vec4" is the variant written (without a
    #: GPU) against "scalar"'s 42.5 us at K = 1,024 (bytes in flight, not bytes: the same page); the same bits, the
    #: default only after the same measurement.
    many_update_kernel: str = "scalar"
    #: Many-model GPU engine: time cuBLASLt's heuristic candidates for layer 0's GEMMs on their real shapes and keep
    #: the fastest, as the graph engine does (autotune_algos); False keeps cuBLASLt's first choice. The forward GEMM
    #: measured 36.6 us a step at K = 1,024 logistic regressions against a 5-11 us budget (docs/design/many-models.md);
    #: other algorithms round the sums in other orders. Off until bench_many.py's fastnn-next measures it.
    many_autotune: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ConfigError(f"Tuning.{f.name} must be True or False, got {value!r}")
        for name, low in (("autotune_algos", 1), ("gemm_sm_carveout", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"Tuning.{name} must be an integer >= {low}, got {value!r}")
        for name, allowed in (("many_loss_kernel", MANY_LOSS_KERNELS), ("many_update_kernel", MANY_UPDATE_KERNELS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise ConfigError(f"Tuning.{name} must be one of {allowed}, got {value!r}")
        layouts = self.fused_layouts
        if not isinstance(layouts, tuple) or not layouts or any(k not in FUSED_LAYOUTS for k in layouts):
            raise ConfigError(f"Tuning.fused_layouts must be a non-empty tuple of {FUSED_LAYOUTS}, got {layouts!r}")


def check_tuning(tuning: object) -> Tuning:
    """`tuning` as a Tuning (None: the defaults).

    Raises:
        ConfigError: `tuning` is neither None nor a `fastnn.engine.Tuning`.
    """
    if tuning is None:
        return Tuning()
    if not isinstance(tuning, Tuning):
        raise ConfigError(f"tuning must be a fastnn.engine.Tuning or None, got {type(tuning).__name__}")
    return tuning
