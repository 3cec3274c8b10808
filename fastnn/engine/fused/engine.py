"""The fused engine: a small network's whole epoch in one persistent kernel, the weights kept on chip.

It is the graph engine (`graph/`) with another training context (`make_train_context`): the parameters and optimizer
state stay in the graph engine's flat training state, and evaluation, prediction, snapshots, divergence handling,
interruption and checkpoints are inherited unchanged. Only an epoch differs: instead of ~14 library nodes per step,
its graph is one cluster launch of `native/fused_logreg.cu` (logistic regression where its plan serves it),
`native/fused_mlp.cu` (narrow MLPs at small batches, likewise) or `native/fused.cu` (everything else), which loads
the state on chip, trains every step of the epoch and writes the state back, followed by the graph engine's
epoch-end nodes. All three take the same arguments. The kernel is compiled per model shape and loss (NVRTC,
disk-cached: a regression, loss "mse", has its own head); `plan.py` decides which kernel and what fits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._errors import ConfigError
from ...cuda import driver
from ..base import EngineConfig, kernel_engine_limits
from ..graph import GraphEngine
from ..graph.contexts import TrainContext
from ..graph.kernels import module, persistent_epoch_args, record_epoch_end, update_file
from ..graph.upload import DataKey
from .plan import MIN_CC, FusedPlan, fused_plan

__all__ = ["AUTO_MAX_HIDDEN", "FusedEngine", "FusedTrainContext", "fast_kernel_serves", "prefer_fused"]

#: The auto rule (engine="auto"): the fused engine where it holds the model and its widest hidden layer is at
#: most this wide. Measured on an H100 with benchmarks/bench_fused.py (mixed, one process, graph vs fused):
#: logistic regression 784-10 batch 128 15.9 vs 8.5 us/step, MLP 784-128x3-10 batch 32 45.9 vs 38.6 us/step;
#: the width sweep (benchmarks/NOTES.md): fused faster up to h = 128 (1.17-1.91x), slower from h = 192 (0.62x).
AUTO_MAX_HIDDEN = 128

def _x_dtype_for_plan(config: EngineConfig) -> type:
    """The input type the engine is judged with before fit() brings data: float32, the larger (its staged rows
    take 4 bytes an element against uint8's 1), so a model accepted here fits whatever inputs come."""
    return np.float32


def prefer_fused(config: EngineConfig, device) -> bool:
    """The measured rule for engine="auto": fused where every hidden layer is at most AUTO_MAX_HIDDEN wide."""
    hidden = config.model.sizes[1:-1]
    return AUTO_MAX_HIDDEN >= 0 and (not hidden or max(hidden) <= AUTO_MAX_HIDDEN)


def fast_kernel_serves(config: EngineConfig, device) -> bool:
    """Whether a fast fused kernel (fused_logreg.cu, fused_mlp.cu) serves `config` for uint8 or float32 inputs, not
    only the generic fused.cu: engine="auto" gives a model the fused engine over the grid engine only then (select)."""
    smem = device.max_shared_memory_optin
    for x_dtype in (np.uint8, np.float32):
        plan = fused_plan(config, x_dtype, smem)
        if isinstance(plan, FusedPlan) and plan.source != "fused.cu":
            return True
    return False


class FusedEngine(GraphEngine):
    """engine="fused": one persistent cluster kernel per epoch; the graph engine's math, on chip."""

    #: The epoch is one kernel of its own: cuBLASLt's and cuDNN's handles, the workspace and the gather and loss
    #: kernels are made on a thread while the first fit trains, for the first evaluation or prediction (graph/ready.py).
    step_libraries_at_build = False

    @staticmethod
    def unsupported_reason(config: EngineConfig, device) -> str | None:
        """Why this engine cannot train `config` on `device` (a fastnn.cuda.driver.Device), or None."""
        reason = kernel_engine_limits(config, device, MIN_CC, "thread-block clusters")
        if reason is not None:
            return reason
        plan = fused_plan(config, _x_dtype_for_plan(config), device.max_shared_memory_optin)
        return plan if isinstance(plan, str) else None

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], ordinal: int = 0,
                 graph_fallback: bool = False) -> None:  # fmt: skip
        reason = self.unsupported_reason(config, driver.get_device(ordinal))
        if reason is not None:
            raise ConfigError(f"engine='fused' cannot train this model: {reason}")
        super().__init__(config, state, ordinal)
        #: engine="auto" chose this engine before it saw the data: a weighted fit (whose weighted mean the fused
        #: kernels do not compute) trains with the graph engine's step instead; engine="fused" refuses it by name.
        self.graph_fallback = graph_fallback

    @property
    def name(self) -> str:
        """The engine whose kernels train (`Trainer.engine`): "fused", or "graph" while a weighted fit's set trains
        with the graph engine's step (only on a fused engine engine="auto" chose)."""
        train = getattr(self, "_train", None)
        return "graph" if train is not None and not isinstance(train, FusedTrainContext) else "fused"

    @property
    def weighted_fits(self) -> bool:
        """Unequal sample weights train only on a fused engine engine="auto" chose, with the graph step."""
        return self.graph_fallback

    def context_serves(self, ctx: TrainContext) -> bool:
        return isinstance(ctx, FusedTrainContext) == (self._weight is None or not self.graph_fallback)

    def fused_kernel(self, x_dtype: np.dtype) -> tuple[object, FusedPlan]:
        """The compiled kernel and its plan for training data of `x_dtype`."""
        plan = fused_plan(self.config, x_dtype, self.dev.max_shared_memory_optin)
        if isinstance(plan, str):  # unsupported_reason said yes for this config: cannot happen
            raise ConfigError(f"engine='fused' cannot train this model: {plan}")
        kernel = module(self.dev, plan.source, plan.options).function(plan.function)
        if kernel.max_active_clusters((plan.cluster, 1, 1), (plan.threads, 1, 1), plan.smem_bytes, plan.cluster) < 1:
            raise ConfigError(
                f"engine='fused' cannot train this model: a cluster of {plan.cluster} CTAs with "
                f"{plan.smem_bytes:,} bytes of shared memory each cannot be scheduled on {self.dev.name}"
            )
        return kernel, plan

    def make_train_context(self, x: np.ndarray, y: np.ndarray, key: DataKey) -> TrainContext:
        """The fused kernel's context, or for a weighted fit on an engine engine="auto" chose the graph step's (its
        libraries and update.cu made once, before any capture)."""
        if self._weight is None or not self.graph_fallback:
            return FusedTrainContext(self, x, y, key)
        self.load_step_libraries()
        if self.update_mod is None:
            self.update_mod = module(self.dev, *update_file(self.spec))
        return super().make_train_context(x, y, key)


class FusedTrainContext(TrainContext):
    """The resident training set and its epoch graph: one fused kernel launch plus the epoch-end nodes."""

    def __init__(self, engine: FusedEngine, x: np.ndarray, y: np.ndarray, key: DataKey) -> None:
        self.engine = engine  # its fused_kernel (build runs in TrainContext.__init__); the rest is the record's
        super().__init__(engine.resources, x, y, key)

    def build(self, buf: Callable) -> None:
        self.require_resident("fused")
        self.kernel, self.plan = self.engine.fused_kernel(self.dtype)

    def capture_epoch(self):
        return self.res.capture(self.record_epoch)

    def record_epoch(self) -> None:
        res = self.res
        args = persistent_epoch_args(self)
        p = self.plan
        self.kernel.launch((p.cluster, 1, 1), (p.threads, 1, 1), args, res.stream, p.smem_bytes, cluster=p.cluster)
        record_epoch_end(res)
