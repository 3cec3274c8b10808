"""`GraphEngine` (engine="graph"): every step of an epoch recorded once into a CUDA graph, then replayed.

The engine owns the device, its stream and library handles, and the flat training state: [params | optimizer
state 1 | state 2], one copy of which is the snapshot the epoch graph takes while the loss stays finite, so a
divergence falls back to the last finite epoch. What a step records is in step.py (top to bottom); the kernels
it launches in kernels.py, the library plans in plans.py, the resident sets and captured graphs in contexts.py,
the data-parallel collectives and checks in parallel.py. Those helpers take the engine's `Resources` record
(resources.py), never the engine itself. Everything that can fail or query (plans, heuristics,
autotuning, kernel loading) happens before capture.
"""

from __future__ import annotations

import numpy as np

from ..._data import input_affine
from ..._errors import ConfigError
from ..._gpu_arrays import CudaArray
from ..._loss import describe
from ...cuda import cublaslt, cudnn, driver, nccl  # nccl: the module only, NCCL itself loads on first use (optional)
from ..base import Engine, EngineConfig, OnEpoch
from ..epochs import EpochRun, EpochRuns, drive_epochs
from ..group import Group
from ..numpy_engine import r2_score
from ..plan import param_layout, precision_spec
from . import kernels, profile
from .buffers import Owner, itemsize, round256
from .contexts import EvalContext, TrainContext
from .parallel import DataParallel
from .ready import Preparation
from .resources import Resources
from .upload import DataKey, data_key

__all__ = ["GraphEngine"]

WORKSPACE_BYTES = 32 << 20  # cuBLASLt workspace: room for split-K on skinny shapes (Hopper)


def _resource(name: str) -> property:
    """GraphEngine.<name>: its Resources' field of that name, for the engine's code, its subclasses and tests."""

    def get(self: GraphEngine) -> object:
        return getattr(self.resources, name)

    def put(self: GraphEngine, value: object) -> None:
        setattr(self.resources, name, value)

    return property(get, put, doc=f"Resources.{name}")


class GraphEngine(Engine):
    """`device="cuda"`, engine="graph": trains with one CUDA graph per epoch; the NumPy engine's math on the GPU."""

    device = "cuda"
    name = "graph"
    #: Whether the engine trains with the graph step: its constructor then makes what the step's plans and kernels
    #: need (load_step_libraries, and native/update.cu's optimizer step), so that a failure is reported before any
    #: work. The fused and grid engines' epoch needs none of it: a thread started when they are built makes what
    #: their evaluation needs while the first fit trains (ready.py), and update.cu (about a second of NVRTC on a cold
    #: cache) is never compiled.
    step_libraries_at_build = True
    #: Whether unequal sample weights train here (set_sample_weight): the graph step's, not one-kernel epochs'.
    weighted_fits = True
    _weight: np.ndarray | None = None  # the next fit's row weights (set_sample_weight)

    # The record's fields, read and written through the engine: self.stream is self.resources.stream.
    loss = _resource("loss")
    y_words = _resource("y_words")
    group = _resource("group")
    sharded = _resource("sharded")
    spec = _resource("spec")
    layout = _resource("layout")
    dev = _resource("dev")
    stream = _resource("stream")
    lt = _resource("lt")
    workspace = _resource("workspace")
    dnn = _resource("dnn")
    gather_mod = _resource("gather_mod")
    loss_mod = _resource("loss_mod")
    update_mod = _resource("update_mod")
    epoch_mod = _resource("epoch_mod")
    opt_names = _resource("opt_names")
    param_bytes = _resource("param_bytes")
    opt_bytes = _resource("opt_bytes")
    state_bytes = _resource("state_bytes")
    train_state = _resource("train_state")
    snapshot = _resource("snapshot")
    w16 = _resource("w16")
    grads = _resource("grads")
    epoch_state = _resource("epoch_state")
    feature_affine = _resource("feature_affine")
    parallel = _resource("parallel")

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], ordinal: int = 0,
                 group: Group | None = None) -> None:  # fmt: skip
        self.config = config
        if group is not None:
            ordinal = group.device
        # Each rank of a data-parallel group (None: one GPU) trains on its share of the batch (parallel.py); sharded:
        # each updates its part of every layer (Tuning.sharded_update), the layout splitting every layer evenly.
        sharded = group is not None and config.tuning.sharded_update
        #: What the helpers (step, kernels, plans, contexts, parallel, profile) take instead of the engine: the
        #: device, stream, handles, kernels and buffers, filled below (self.stream is self.resources.stream).
        self.resources = Resources(
            config=config, spec=precision_spec(config.precision),
            layout=param_layout(config.model, group.world if sharded else 1),
            loss=describe(config.loss), y_words=describe(config.loss).target_words(config.model.classes),
            group=group, sharded=sharded, dev=driver.get_device(ordinal),
        )  # fmt: skip
        self._res = Owner()
        self._train: TrainContext | None = None
        self._eval: EvalContext | None = None
        self._closed = False
        self._state_set = False
        self._prep: Preparation | None = None  # the step libraries being made on a thread (ready.py)
        own = self._res.own
        try:
            self.dev.make_current()
            self.stream = own(driver.Stream(self.dev))
            self.lt: cublaslt.Handle | None = None  # these five: load_step_libraries()
            self.workspace: cublaslt.Workspace | None = None
            self.dnn: cudnn.Handle | None = None
            self.gather_mod = self.loss_mod = None
            self.update_mod: driver.Module | None = None  # the graph step's optimizer update (update.cu)
            if self.step_libraries_at_build:
                self.load_step_libraries()
                self.update_mod = kernels.module(self.dev, *kernels.update_file(self.spec))
            self.epoch_mod = kernels.module(self.dev, "epoch.cu")  # every engine's epoch-end kernels
            self.opt_names = config.optimizer.state_names
            total = self.layout.total
            # Training state: [params | optimizer state 1 | state 2]; one copy of it is the snapshot.
            self.param_bytes = round256(total * itemsize(self.spec.param))
            self.opt_bytes = round256(total * 4)  # one optimizer state buffer (fp32)
            self.state_bytes = self.param_bytes + len(self.opt_names) * self.opt_bytes
            self.train_state = own(driver.DeviceBuffer(self.state_bytes))
            self.snapshot = own(driver.DeviceBuffer(self.state_bytes))
            self.w16 = own(driver.DeviceBuffer(total * 2)) if self.spec.half_copy else None
            self.grads = own(driver.DeviceBuffer(total * itemsize(self.spec.grad)))
            self.grads.memset(0)  # the padding between tensors is read by the update, never written
            self.epoch_state = own(driver.DeviceBuffer(256))
            # evaluate's sums: (loss sum, correct count), and for a regression each output's sum of squared errors.
            self.eval_out = own(driver.PinnedBuffer(16 + (0 if self.loss.labels else 8 * config.model.classes)))
            #: The data-parallel side stream, collectives and checks (None: one GPU).
            self.parallel = DataParallel(self.resources, group, own) if group is not None else None
            # A per-feature normalize: (scale[d], shift[d]) per input dtype, read by the gather (built before any
            # capture: nothing is allocated or uploaded while a graph records).
            self.feature_affine: dict[np.dtype, driver.DeviceBuffer] = {}
            if config.normalize is not None and np.ndim(config.normalize[0]) + np.ndim(config.normalize[1]):
                for dt in (np.dtype(np.uint8), np.dtype(np.float32)):
                    scale, shift = input_affine(dt, config.normalize)
                    table = np.concatenate([np.broadcast_to(v, (config.model.in_features,)) for v in (scale, shift)])
                    self.feature_affine[dt] = own(driver.DeviceBuffer(table.size * 4))
                    self.upload(self.feature_affine[dt], table.astype(np.float32))
            self.set_state(state)
            if not self.step_libraries_at_build:  # last: a constructor that fails leaves no thread behind
                self._prep = Preparation(self._step_library_steps(), self.dev.make_current)
        except BaseException:
            self._res.release()
            raise

    def _step_library_steps(self) -> list[tuple[str, object]]:
        """What load_step_libraries makes, as (attribute, make(made so far)) in the order the thread makes them: the
        compiles first (the long part on a cold kernel cache, CPU work beside the fit's), then the libraries'
        handles, then cuBLASLt's first heuristic query (cublaslt.warm_up; "_": no attribute, nothing kept)."""
        return [
            ("gather_mod", lambda made: kernels.module(self.dev, *kernels.gather_file(self.spec))),
            ("loss_mod", lambda made: kernels.module(self.dev, *kernels.loss_file(self.spec, not self.loss.softmax))),
            ("lt", lambda made: cublaslt.Handle(self.dev)),  # the device named: made on another thread
            ("workspace", lambda made: cublaslt.Workspace(WORKSPACE_BYTES, self.dev)),
            ("dnn", lambda made: cudnn.Handle(self.stream, self.dev)),
            ("_heuristic", lambda made: cublaslt.warm_up(made["lt"], made["workspace"])),
        ]

    def load_step_libraries(self) -> None:
        """Make, once, what the graph step's and the evaluation's plans and kernels use: the cuBLASLt handle and
        workspace, the cuDNN handle, the gather and loss kernels. Before any capture (they allocate and load)."""
        if self.loss_mod is not None and self.dnn is not None:  # all there
            return
        own = self._res.own
        self.dev.make_current()
        if self._prep is not None:  # what the thread made while the fit trained; it makes the rest below
            made, self._prep = self._prep.take(), None
            for name, obj in made.items():
                if not name.startswith("_"):
                    setattr(self, name, obj if name.endswith("_mod") else own(obj))  # modules: the process's
        if self.lt is None:  # one by one: after a failure the next call makes only what is missing
            self.lt = own(cublaslt.Handle())
        if self.workspace is None:
            self.workspace = own(cublaslt.Workspace(WORKSPACE_BYTES))
        if self.dnn is None:
            self.dnn = own(cudnn.Handle(self.stream))
        if self.gather_mod is None:
            self.gather_mod = kernels.module(self.dev, *kernels.gather_file(self.spec))
        if self.loss_mod is None:
            self.loss_mod = kernels.module(self.dev, *kernels.loss_file(self.spec, not self.loss.softmax))

    def set_sample_weight(self, weight: np.ndarray | None) -> None:
        """The next fit's row weights (None: unweighted): the graph step gathers each batch's weights beside its
        labels and launches the weighted loss (native/loss.cu's wxent / wmse), the NumPy engine's weighted mean.

        Raises:
            ConfigError: unequal weights on an engine whose epoch is one kernel (fused, grid: Engine's refusal), on
                a data-parallel group, or with drop_last (what the history divides by is the whole set's weight).
        """
        if weight is not None:
            if not self.weighted_fits:
                Engine.set_sample_weight(self, weight)
            if self.group is not None:
                raise ConfigError("sample_weight: the graph engine trains weighted fits on one GPU, not across a "
                                  "data-parallel group; train a weighted fit with devices= one GPU")  # fmt: skip
            if self.config.drop_last:
                raise ConfigError("sample_weight: the graph engine's weighted fits need drop_last=False (each "
                                  "epoch's weighted mean is over every row)")  # fmt: skip
        self._weight = weight

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._prep is not None:  # skip what it has not begun; release what it made with the rest
            for name, obj in self._prep.cancel().items():
                if not name.endswith("_mod") and not name.startswith("_"):
                    self._res.own(obj)
            self._prep = None
        try:
            self.dev.make_current()
            if self.group is not None and not self.group.comm.closed:
                # Polled, at most the group's timeout: a queued collective may wait for a peer that is gone. Ended
                # meanwhile (timed out, aborted by another thread, NCCL's error), its collectives return.
                try:
                    self.sync()
                except (nccl.CommAborted, nccl.NcclError):
                    pass
                except BaseException:  # Ctrl-C: the buffers are freed next, so the collectives must end first
                    self.group.abort()
                    raise
            self.stream.synchronize()
        finally:
            for ctx in (self._eval, self._train):
                if ctx is not None:
                    ctx.release()
            self._train = self._eval = None
            self._res.release()

    # ------------------------------------------------------------------ parameters
    def get_state(self) -> dict[str, np.ndarray]:
        self.dev.make_current()
        self.stream.synchronize()
        raw = np.empty(self.state_bytes, dtype=np.uint8)
        self.train_state.download(raw)
        total = self.layout.total
        out = self.layout.unpack(raw[: total * itemsize(self.spec.param)].view(self.spec.param))
        for i, name in enumerate(self.opt_names):
            start = self.param_bytes + i * self.opt_bytes
            out.update(self.layout.unpack(raw[start : start + total * 4].view(np.float32), f"opt.{name}."))
        return out

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the parameters, and the optimizer state where `state` holds all of it; the rest is kept
        (zero before the first call), as the NumPy engine does."""
        self.dev.make_current()
        self.stream.synchronize()
        # Every tensor checked (and cast where its type differs) before a byte is written: a bad one changes nothing.
        regions = [(0, self.spec.param, self.layout.placed(state, self.spec.param))]
        for i, name in enumerate(self.opt_names):
            prefix = f"opt.{name}."
            if all(prefix + n in state for n in self.layout.names):
                tensors = self.layout.placed({n: state[prefix + n] for n in self.layout.names}, np.float32)
                regions.append((self.param_bytes + i * self.opt_bytes, np.float32, tensors))
        if not self._state_set:
            self.train_state.memset(0)
        # Each region given is rewritten whole, its padding zero (layout.pack's bytes); the others stay as they are.
        # Each tensor goes straight from the caller's array: no flat host copy of the whole state (for 140M parameters
        # a flat copy was 0.56 GB of fresh pages per region, written and then read by the upload).
        for start, dtype, tensors in regions:
            driver.memset_d32(self.train_state.ptr + start, 0, self.layout.total * itemsize(dtype) // 4, self.stream)
            for off, tensor in tensors:
                self.train_state.upload(tensor, offset=start + off * itemsize(dtype))
        self._state_set = True
        kernels.refresh_half_copy(self.resources)
        self.stream.synchronize()

    # ------------------------------------------------------------------ what epochs.EpochRun uses (EpochEngine)
    @property
    def train_context(self) -> TrainContext | None:
        """The resident training set and its captured epoch (None before set_train_data)."""
        return self._train

    def write_epoch_state(self, epoch: int, step0: int, lr: int = 0, hist: int = 0) -> None:
        """Start a fit's device state: epoch counters, step count, and where its lr table and history are."""
        self.resources.write_epoch_state(epoch, step0, lr, hist)

    def save_snapshot(self) -> None:
        """Queue a copy of the training state into the snapshot (a fit's starting point, kept if it diverges)."""
        driver.copy_dtod(self.snapshot.ptr, self.train_state.ptr, self.state_bytes, self.stream)

    def restore_snapshot(self) -> None:
        """Put the training state back to the snapshot (the end of the last finite epoch) and wait for it."""
        driver.copy_dtod(self.train_state.ptr, self.snapshot.ptr, self.state_bytes, self.stream)
        kernels.refresh_half_copy(self.resources)
        self.stream.synchronize()

    def check_usable(self) -> None:
        """Refuse to train once a data-parallel group's communicator has ended (parallel.check_usable)."""
        if self.parallel is not None:
            self.parallel.check_usable()

    def wait(self, event) -> None:
        """Block until `event` (the end of an epoch's queued work) completes; polled for a group (waiting.py)."""
        if self.parallel is None:
            event.synchronize()
        else:
            self.parallel.wait(event)

    def sync(self) -> None:
        """Block until everything queued on the stream has run (polled for a group: Resources.sync)."""
        self.resources.sync()

    # ------------------------------------------------------------------ building blocks
    def upload(self, dst, array: np.ndarray | CudaArray) -> None:
        """Host (or GPU array) -> `dst` on this engine's stream (Resources.upload)."""
        self.resources.upload(dst, array)

    def capture(self, record) -> driver.GraphExec:
        """Record `record()` on the stream into a graph and instantiate it (Resources.capture)."""
        return self.resources.capture(record)

    def context_serves(self, ctx: TrainContext) -> bool:
        """Whether the held training context's kind still serves the next fit (a kernel engine engine="auto" chose
        trains a weighted fit with the graph step: GridEngine, FusedEngine)."""
        return True

    def make_train_context(self, x: np.ndarray, y: np.ndarray, key: DataKey) -> TrainContext:
        """The training context for a new resident set (the fused engine makes its own)."""
        return TrainContext(self.resources, x, y, key)

    # ------------------------------------------------------------------ Engine API
    def set_train_data(self, x: np.ndarray, y: np.ndarray) -> None:
        self.check_usable()
        self.dev.make_current()
        if self.parallel is not None:
            self.parallel.check_data_agrees(x.shape[0])
        key = data_key(x, y)
        ctx = self._train
        if ctx is not None and not self.context_serves(ctx):  # a kernel engine's fit moved to or from the graph step
            self.stream.synchronize()
            ctx.release()
            self._train = ctx = None
        if ctx is not None and ctx.key == key:
            return  # the very same arrays: already resident
        if ctx is not None and (ctx.n, ctx.dtype) == (x.shape[0], x.dtype):
            ctx.load(x, y, key)  # same shape: new values into the same buffers, the graph stays valid
            return
        if ctx is not None:
            self.stream.synchronize()  # queued work may still read its buffers
            ctx.release()
        self._train = None
        self._train = self.make_train_context(x, y, key)

    def fit_epochs(
        self, first_epoch, first_step, lrs, eval_data, eval_after, on_epoch: OnEpoch, stoppable=False, on_step=None,
        end_epoch=None,
    ) -> None:  # fmt: skip
        self.last_reported = None
        if self.parallel is not None:
            if self._train is None:
                raise RuntimeError("set_train_data must come before fit_epochs")
            self.dev.make_current()
            stoppable = self.parallel.check_call_agrees(self._train.steps, first_epoch, first_step, lrs, end_epoch,
                                                        stoppable)  # fmt: skip
        if self._train is not None:  # before EpochRun captures: a weighted fit's nodes differ (contexts.use_weights)
            self.dev.make_current()
            self._train.use_weights(self._weight)
        run = EpochRun(self, first_epoch, first_step, lrs, eval_data, eval_after)
        vote = self.parallel.vote_stop if self.parallel is not None else None
        drive_epochs(self, EpochRuns([run], stop_vote=vote), on_epoch, stoppable)

    def profile_step(self, repeats: int = 1000) -> list[tuple[str, float]]:
        """Microseconds per node of the first training step, and of the whole step (profile.profile_step)."""
        return profile.profile_step(self.resources, self._train, repeats)

    def eval_context(self, x: np.ndarray, y: np.ndarray | None) -> EvalContext:
        """The forward graph for x's shape, with x and y uploaded afresh: evaluation data is small, and
        uploading it on every call (once per `fit`, not per epoch) means an array changed in place is seen."""
        self.load_step_libraries()  # the fused engine's first evaluation: its forward plans need them
        ctx = self._eval
        if ctx is not None and (ctx.n, ctx.dtype) == (x.shape[0], x.dtype):
            ctx.load(x, y)
            return ctx
        if ctx is not None:
            self.stream.synchronize()
            ctx.release()
        self._eval = None
        self._eval = EvalContext(self.resources, x, y)
        return self._eval

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        self.dev.make_current()
        ctx = self.eval_context(x, y)
        sse = 0 if self.loss.labels else self.eval_out.ptr + 16
        ctx.run(self.eval_out.ptr, sse)
        self.stream.synchronize()
        if not self.loss.labels:  # the mean of the rows' mean squared errors, and R^2 from each output's sum (host)
            sums = self.eval_out.view(np.float64, (2 + self.config.model.classes,))
            return float(sums[0] / ctx.n), r2_score(sums[2:].copy(), y)
        loss_sum, correct = self.eval_out.view(np.float64, (2,))
        return float(loss_sum / ctx.n), float(correct / ctx.n)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        if not self.loss.softmax:
            raise RuntimeError("predict_proba is a classifier's: this engine trains loss 'mse' (predict_outputs)")
        return self._forward_all(x)

    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        if self.loss.softmax:
            raise RuntimeError("predict_outputs is a regression's (loss 'mse'): this engine trains a classifier")
        return self._forward_all(x)

    def _forward_all(self, x: np.ndarray) -> np.ndarray:
        """The evaluation graph over x: every row's softmax probabilities, or a regression's outputs, (N, k)."""
        self.dev.make_current()
        ctx = self.eval_context(x, None)
        ctx.run(self.eval_out.ptr)
        self.stream.synchronize()
        out = np.empty((ctx.n, self.config.model.classes), dtype=self.spec.logits)
        ctx.probs.download(out)
        return out.astype(np.float32)
