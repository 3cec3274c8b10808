"""What the graph engine's helpers use of it, as one narrow record: `Resources`.

The step (step.py), the kernels' launches (kernels.py), the library plans (plans.py), the contexts (contexts.py),
the data-parallel part (parallel.py) and the profiler (profile.py) take this record, never the engine: the model's
configuration and precision, the device and its stream, the library handles and loaded kernels, the flat training
state and its layout. The engine (engine.py) fills it and owns what it holds (`GraphEngine.stream` is its record's
`stream`); the helpers import this module, not the engine's, so no helper depends on the module that uses it
(tests/test_layering.py keeps the graph package's imports free of cycles).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._gpu_arrays import CudaArray
from ..._loss import Loss
from ...cuda import cublaslt, cudnn, driver
from ..base import EngineConfig
from ..epochs import EPOCH_STATE_DTYPE
from ..group import Group
from ..plan import ParamLayout, PrecisionSpec
from .buffers import itemsize
from .upload import upload

__all__ = ["Resources"]


@dataclass(eq=False)
class Resources:
    """The graph engine's device, stream, library handles, kernels and buffers (None until the engine makes them)."""

    # What is trained, and on how many ranks
    config: EngineConfig
    spec: PrecisionSpec
    layout: ParamLayout
    loss: Loss  #: the loss's description (fastnn/_loss.py): labels or float targets, a softmax or linear outputs
    y_words: int  #: 32-bit words of y per sample: an int32 label, or a regression's k float32 targets
    group: Group | None  #: the data-parallel group (None: one GPU)
    sharded: bool  #: each rank updates its part of every layer (Tuning.sharded_update)
    # Where it runs
    dev: driver.Device
    stream: driver.Stream | None = None
    # The libraries and kernels (the graph step's: GraphEngine.load_step_libraries; update.cu: the graph step only)
    lt: cublaslt.Handle | None = None
    workspace: cublaslt.Workspace | None = None
    dnn: cudnn.Handle | None = None
    gather_mod: driver.Module | None = None
    loss_mod: driver.Module | None = None
    update_mod: driver.Module | None = None
    epoch_mod: driver.Module | None = None
    # The flat training state [params | optimizer state 1 | state 2], its snapshot, gradients and epoch state
    opt_names: tuple[str, ...] = ()
    param_bytes: int = 0
    opt_bytes: int = 0  #: one optimizer state buffer (fp32)
    state_bytes: int = 0
    train_state: driver.DeviceBuffer | None = None
    snapshot: driver.DeviceBuffer | None = None
    w16: driver.DeviceBuffer | None = None  #: "mixed": the fp16 copy of the fp32 master weights the GEMMs read
    grads: driver.DeviceBuffer | None = None
    epoch_state: driver.DeviceBuffer | None = None
    #: A per-feature normalize: (scale[d], shift[d]) per input dtype, read by the gather.
    feature_affine: dict[np.dtype, driver.DeviceBuffer] = field(default_factory=dict)
    #: The data-parallel side stream, collectives and checks (parallel.DataParallel, which takes this record; None:
    #: one GPU).
    parallel: Any = None

    # ---- parameters
    def param_ptr(self, name: str, gemm_type: type) -> int:
        """Address of parameter `name` in the storage whose type matches a GEMM of `gemm_type`."""
        off, _ = self.layout.slot(name)
        base, t = self.gemm_storage(gemm_type)
        return base + off * itemsize(t)

    def gemm_storage(self, gemm_type: type) -> tuple[int, type]:
        """(flat buffer, element type) of the parameters a GEMM of `gemm_type` reads: the parameters themselves,
        or in "mixed" for fp16 GEMMs the fp16 copy of the fp32 master."""
        if gemm_type == self.spec.param:
            return self.train_state.ptr, self.spec.param
        return self.w16.ptr, np.float16

    def out_type(self, layer: int) -> type:
        """Type of `layer`'s forward output, and of the bias its GEMM reads: the logits' type on the last layer."""
        return self.spec.logits if layer == len(self.config.model.layers) - 1 else self.spec.operand

    def grad_ptr(self, name: str) -> int:
        off, _ = self.layout.slot(name)
        return self.grads.ptr + off * itemsize(self.spec.grad)

    # ---- the stream
    def write_epoch_state(self, epoch: int, step0: int, lr: int = 0, hist: int = 0) -> None:
        """Start a fit's device state: epoch counters, step count, and where its lr table and history are."""
        st = np.zeros(1, dtype=EPOCH_STATE_DTYPE)
        st["epoch"], st["step0"], st["lr"], st["hist"] = epoch, step0, lr, hist
        self.epoch_state.upload(st.view(np.uint8))

    def upload(self, dst, array: np.ndarray | CudaArray) -> None:
        """Host (or GPU array) -> `dst` on this stream (upload.upload: staged in pinned chunks)."""
        upload(self.dev, self.stream, dst, array)

    def sync(self) -> None:
        """Block until everything queued on the stream has run; for a group through polling, since queued
        collectives may wait for peers that never come."""
        if self.parallel is None:
            self.stream.synchronize()
        else:
            self.parallel.sync()

    def capture(self, record: Callable[[], None]) -> driver.GraphExec:
        """Record `record()` on the stream into a graph and instantiate it."""
        self.sync()  # a group's autotuning step queued all-reduces
        self.stream.begin_capture()
        try:
            record()
        except BaseException:
            with contextlib.suppress(Exception):  # the recording's error is the one to report
                self.stream.end_capture().close()
            raise
        graph = self.stream.end_capture()
        try:
            return graph.instantiate(node_priority=self.group is not None and self.config.tuning.comm_high_priority)
        finally:
            graph.close()
