"""`Tuning`: the engines' measured choices as data, the winners as defaults.

How an engine runs, never what it computes (up to summation order and the GEMM algorithms picked). Benchmarks and
tests pass another `Tuning` (through `EngineConfig`, or `Trainer(tuning=...)`) to compare variants; nothing patches
module state. A variant that lost its measurement leaves the product (its experiment moves to
`benchmarks/kernels/`); the data-parallel switches below were never measured on two GPUs, so they stay, off.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._errors import ConfigError

__all__ = ["FUSED_LAYOUTS", "Tuning", "check_tuning"]

#: The fused engine's shared-memory layouts (fused/plan.py): "standard" keeps a gradient array per weight array
#: and, in "mixed", an fp16 operand copy; "lean" keeps neither (see `Tuning.fused_layouts`).
FUSED_LAYOUTS = ("standard", "lean")


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
    #: Fused engine: MLPs on native/fused_mlp.cu wherever fused/plan.py's `mlp_plan` serves them (hidden layers up to
    #: 128 wide, batches up to 32, uint8, "mixed"/"fp16", SGD; issue 25, not yet measured). False keeps fused.cu.
    fused_mlp: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ConfigError(f"Tuning.{f.name} must be True or False, got {value!r}")
        for name, low in (("autotune_algos", 1), ("gemm_sm_carveout", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"Tuning.{name} must be an integer >= {low}, got {value!r}")
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
