"""The graph engine (engine="graph"): one CUDA graph of library calls and fastnn kernels per epoch; any model.

Modules, in the order a newcomer reads them:
- `engine`: `GraphEngine`, the device, the flat training state and the Engine API;
- `resources`: `Resources`, what the helpers below take of the engine (device, stream, handles, kernels,
  buffers): none of them imports the engine;
- `step`: one training step top to bottom (gather, forward, softmax, loss, backward, update) and the epoch; a
  regression (loss "mse") has no softmax and its own loss kernel;
- `kernels`: fastnn's own kernels (native/gather.cu, loss.cu, update.cu, epoch.cu) with their arguments packed;
- `plans`: the cuBLASLt GEMM plans (epilogues fused) and cuDNN's softmax;
- `contexts`: a resident training set with its captured epoch, an evaluation set with its forward graph;
- `parallel`: one rank of a data-parallel group: gradient sums, the sharded update, agreement checks, stop vote;
- `waiting`: polling a rank's queued work with the group's timeout;
- `upload`: staged host-to-device copies and the identity of the data last uploaded;
- `buffers`: element sizes, an owner of resources, one layer's buffers;
- `profile`: per-node timing of a step.

The engine (and with it the CUDA bindings) is imported on first use of `GraphEngine`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GraphEngine"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .engine import GraphEngine

        return GraphEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
