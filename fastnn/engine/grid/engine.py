"""The grid engine: an MLP's whole epoch in one cooperative persistent kernel over up to one CTA per SM.

It is the graph engine (`graph/`) with another training context (`make_train_context`), as the fused engine is:
parameters and optimizer state stay in the graph engine's flat training state (the kernel reads and writes them in
place, in L2), so evaluation, prediction, snapshots, divergence handling, interruption and checkpoints are inherited
unchanged. An epoch's graph is a memset of the round counter, one cooperative launch of the grid kernel and the
graph engine's epoch-end nodes (or, for a grid engine engine="auto" chose, the graph engine's step where the fast
kernel cannot serve the data: `GridEngine.graph_fallback`, decided once per training set by `GridEngine.step_for`;
the engine's `name`, which `Trainer.engine` reports, then says "graph"). The kernel (`native/grid_fast.cu`, the fast
path, where `plan.fast_plan` serves the model; `native/grid_stream.cu`, the streaming path for wider ones, where
`plan.stream_plan` does; both take the same arguments) is compiled per model shape, batch, precision, optimizer,
loss and GPU SM count (NVRTC, disk-cached); `plan.py` decides what each serves. A model neither serves is refused,
naming engine='graph' (no slow generic kernel stands behind them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._errors import ConfigError, DataError
from ...cuda import driver
from ...cuda.driver import arg_ptr
from ..base import EngineConfig, kernel_engine_limits
from ..graph import GraphEngine
from ..graph.contexts import TrainContext
from ..graph.kernels import module, persistent_epoch_args, record_epoch_end, update_file
from ..graph.upload import DataKey
from ..tuning import GRID_RULE, GridRule
from .plan import HOPPER_SMEM, HOPPER_SMS, MIN_CC, GridPlan, grid_plan

__all__ = ["GridEngine", "GridTrainContext", "check_scratch_fits", "prefer_grid"]

#: Bytes of the sync buffer: the round counter (word 0, zeroed before every launch) and, from byte 128, the phase
#: profile of -DGRID_PROFILE (the kernel's cycle sums of GridPlan.phases, then the step and round counts).
SYNC_BYTES = 256


def check_scratch_fits(scratch_bytes: int, free_bytes: int, data_bytes: int) -> None:
    """The grid kernel's global scratch must fit in the GPU memory left after the training set (which the placement
    choice sized without it).

    Raises:
        DataError: it does not; the message names both sizes and the way out.
    """
    if scratch_bytes + SYNC_BYTES > free_bytes:
        raise DataError(
            f"the grid kernel's global scratch ({scratch_bytes:,} bytes) does not fit in the GPU's free memory "
            f"({free_bytes:,} bytes) beside the training set ({data_bytes:,} bytes): use a smaller batch, or "
            f"engine='graph'"
        )


def prefer_grid(config: EngineConfig, device, rule_override: GridRule | None = None) -> bool:
    """The rule for engine="auto" (tuning.GRID_RULE, data): grid where every hidden layer's width, the batch and the
    precision fall in the measured range and one of the fast kernels (plan.fast_plan's grid_fast.cu, plan.stream_plan's
    grid_stream.cu with at most rule.stream_states optimizer states, at rule.stream_units units a CTA on at least
    rule.stream_min_ctas CTAs) serves the model
    on `device` (None: an H100) for uint8 or float32 inputs. The engine is chosen before the data is seen: rows of a
    type neither fast kernel serves then train with the graph engine's step (GridEngine.graph_fallback)."""
    hidden = config.model.sizes[1:-1]
    rule = rule_override if rule_override is not None else GRID_RULE
    in_range = (
        bool(hidden)
        and rule.min_hidden <= min(hidden)
        and max(hidden) <= rule.max_hidden
        and config.batch_size <= rule.max_batch
        and config.precision in rule.precisions
        and type(config.optimizer).__name__ in rule.optimizers
    )
    if not in_range:
        return False
    sms = device.sm_count if device is not None else HOPPER_SMS
    smem = device.max_shared_memory_optin if device is not None else HOPPER_SMEM
    states = len(config.optimizer.state_names)
    return any(
        isinstance(plan, GridPlan)
        and (
            plan.source == "grid_fast.cu"
            or (
                plan.source == "grid_stream.cu"
                and states <= rule.stream_states
                and plan.units[0] in rule.stream_units
                and plan.ctas >= rule.stream_min_ctas
            )
        )
        for plan in (grid_plan(config, dt, sms, smem) for dt in (np.uint8, np.float32))
    )


class GridEngine(GraphEngine):
    """engine="grid": one cooperative persistent kernel per epoch over up to every SM; the graph engine's math."""

    #: The epoch is one kernel of its own: the graph step's libraries are made on a thread while the first fit trains,
    #: for the first evaluation or prediction (graph/ready.py).
    step_libraries_at_build = False

    @staticmethod
    def unsupported_reason(config: EngineConfig, device) -> str | None:
        """Why this engine cannot train `config` on `device` (a fastnn.cuda.driver.Device), or None. Asked of uint8
        rows, which every model served with float32 rows is served with too (plan.grid_plan): float32 rows of a model
        only uint8 ones fit are refused when they arrive (make_train_context)."""
        reason = kernel_engine_limits(config, device, MIN_CC, "cooperative launches and bulk copies")
        if reason is not None:
            return reason
        plan = grid_plan(config, np.uint8, device.sm_count, device.max_shared_memory_optin)
        return plan if isinstance(plan, str) else None

    def __init__(
        self, config: EngineConfig, state: dict[str, np.ndarray], ordinal: int = 0, graph_fallback: bool = False
    ) -> None:
        reason = self.unsupported_reason(config, driver.get_device(ordinal))
        if reason is not None:
            raise ConfigError(f"engine='grid' cannot train this model: {reason}")
        super().__init__(config, state, ordinal)
        #: engine="auto" chose this engine for its fast kernel before it saw the data (prefer_grid). Where the data's
        #: type still keeps grid_fast.cu and grid_stream.cu from serving the model, an epoch is then the graph engine's
        #: step; so it is where the set or the kernel's scratch does not fit in GPU memory. engine="grid" itself never
        #: falls back: it refuses such rows by name.
        self.graph_fallback = graph_fallback

    _for_weights: TrainContext | None = None  # the graph step's context made for a weighted fit (context_serves)

    def plan_for(self, x_dtype: np.dtype) -> GridPlan | str:
        """The kernel's plan for training data of `x_dtype` on this GPU, or why neither kernel serves it."""
        return grid_plan(self.config, x_dtype, self.dev.sm_count, self.dev.max_shared_memory_optin)

    @property
    def name(self) -> str:
        """The engine whose kernels train (`Trainer.engine`): "grid", or "graph" while the training set this engine
        holds trains with the graph engine's step (`step_for`: only on a grid engine engine="auto" chose)."""
        train = getattr(self, "_train", None)
        return "graph" if train is not None and not isinstance(train, GridTrainContext) else "grid"

    def step_for(self, x_dtype: np.dtype) -> str:
        """Whose step trains a training set of `x_dtype` rows, decided once, when the set arrives: "grid" where
        grid_fast.cu or grid_stream.cu serves them (and the fit is unweighted), else "graph" on a grid engine
        engine="auto" chose
        (graph_fallback; so too where the set and the kernel's scratch do not fit in GPU memory: make_train_context).

        Raises:
            ConfigError: engine="grid" and neither kernel serves rows of `x_dtype`.
        """
        if self.graph_fallback and self._weight is not None:  # a weighted fit: the graph step's weighted loss
            return "graph"
        plan = self.plan_for(x_dtype)
        if isinstance(plan, GridPlan):
            return "grid"
        if not self.graph_fallback:
            raise ConfigError(f"engine='grid' cannot train {np.dtype(x_dtype)} rows of this model: {plan}")
        return "graph"

    @property
    def weighted_fits(self) -> bool:
        """Unequal sample weights train only on a grid engine engine="auto" chose: with the graph step (step_for);
        grid_fast.cu and grid_stream.cu compute the unweighted mean, and engine="grid" refuses weights by name."""
        return self.graph_fallback

    def context_serves(self, ctx: TrainContext) -> bool:
        """A weighted fit needs the graph step's context; an unweighted one any but a weighted fit's (then the kernel
        serves the set again; a graph context made for the rows' type or memory is kept, as before)."""
        if self.graph_fallback and self._weight is not None:
            return not isinstance(ctx, GridTrainContext)
        return ctx is not self._for_weights

    def runs_graph_step(self, x_dtype: np.dtype) -> bool:
        """Whether training data of `x_dtype` trains with the graph engine's step (graph_fallback, and neither
        grid_fast.cu nor grid_stream.cu serves it)."""
        return self.graph_fallback and self.step_for(x_dtype) == "graph"

    def grid_kernel(self, x_dtype: np.dtype) -> tuple[object, GridPlan]:
        """The compiled kernel and its plan for training data of `x_dtype`.

        Raises:
            ConfigError: neither kernel serves rows of `x_dtype` (float32 rows of a model only uint8 ones fit).
        """
        plan = self.plan_for(x_dtype)
        if isinstance(plan, str):
            raise ConfigError(f"engine='grid' cannot train {np.dtype(x_dtype)} rows of this model: {plan}")
        kernel = module(self.dev, plan.source, plan.options).function(plan.function)
        if kernel.max_active_blocks(plan.threads, plan.smem_bytes) < 1:
            raise ConfigError(
                f"engine='grid' cannot train this model: a CTA of {plan.threads} threads with {plan.smem_bytes:,} "
                f"bytes of shared memory cannot be resident on {self.dev.name}"
            )
        return kernel, plan

    def make_train_context(self, x: np.ndarray, y: np.ndarray, key: DataKey) -> TrainContext:
        """The grid kernel's context for this data, or (graph_fallback only) the graph step's.

        Raises:
            ConfigError: engine="grid" and neither kernel serves rows of x's type: before anything is uploaded.
        """
        if self.step_for(x.dtype) == "grid":
            try:
                return GridTrainContext(self, x, y, key)
            except DataError:  # the set, or the kernel's scratch beside it, does not fit in GPU memory
                if not self.graph_fallback:
                    raise
        # engine="auto" chose this engine: the graph step trains what the fast kernel cannot (reading the set from
        # host memory where it must); its libraries and update.cu are made once, before any capture
        self.load_step_libraries()
        if self.update_mod is None:
            self.update_mod = module(self.dev, *update_file(self.spec))
        ctx = super().make_train_context(x, y, key)
        self._for_weights = ctx if self._weight is not None else None  # context_serves: an unweighted fit replaces it
        return ctx


class GridTrainContext(TrainContext):
    """The resident training set and its epoch graph: the counter's memset, one grid launch, the epoch-end nodes."""

    def __init__(self, engine: GridEngine, x: np.ndarray, y: np.ndarray, key: DataKey) -> None:
        self.engine = engine  # its grid_kernel (build runs in TrainContext.__init__); the rest is the record's
        super().__init__(engine.resources, x, y, key)

    def build(self, buf: Callable) -> None:
        self.require_resident("grid")
        self.kernel, self.plan = self.engine.grid_kernel(self.dtype)
        check_scratch_fits(self.plan.scratch_bytes, self.res.dev.mem_info()[0], self.x.nbytes)
        self.scratch = buf(self.plan.scratch_bytes)
        self.sync = buf(SYNC_BYTES)

    def capture_epoch(self):
        return self.res.capture(self.record_epoch)

    def record_epoch(self) -> None:
        res = self.res
        args = persistent_epoch_args(self) + [arg_ptr(self.scratch.ptr), arg_ptr(self.sync.ptr)]
        p = self.plan
        self.sync.memset(0, res.stream)  # the round counter starts at 0 in every launch
        self.kernel.launch((p.ctas, 1, 1), (p.threads, 1, 1), args, res.stream, p.smem_bytes, cooperative=True)
        record_epoch_end(res)

    def phase_names(self) -> tuple[str, ...]:
        """The names of phase_cycles()'s phase words: those of the kernel this context runs (GridPlan.phases)."""
        return self.plan.phases

    def phase_cycles(self) -> np.ndarray:
        """The last epoch's phase profile (Tuning.grid_profile): CTA 0's clock64 cycle sums per phase (the names in
        plan.phases), then the step and round counts (zeros when the kernel was compiled without it)."""
        out = np.zeros(len(self.phase_names()) + 2, dtype=np.int64)
        return self.sync.download(out, offset=128)
