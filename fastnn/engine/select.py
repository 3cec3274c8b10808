"""Which engine a `device` string means: "cpu" (NumPy), "cuda" (the CUDA-graph engine) or "auto".

The GPU modules are imported only when a GPU is asked for, so CPU training never depends on them.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import ConfigError, DeviceUnavailable
from .base import Engine, EngineConfig

__all__ = ["DEVICES", "create_engine", "cuda_engine_class"]

DEVICES = ("auto", "cpu", "cuda")


def cuda_engine_class() -> type[Engine]:
    """The CUDA engine class, if this machine can run it.

    Raises:
        DeviceUnavailable: no usable GPU, or the GPU modules cannot be imported; the message says which.
    """
    try:
        from ..device import cuda_status
    except ImportError as exc:
        raise DeviceUnavailable(f"fastnn.device failed to import: {exc}") from exc
    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(f"no usable GPU: {reason}")
    try:
        from .cuda_engine import CudaEngine
    except ImportError as exc:
        raise DeviceUnavailable(f"the CUDA engine (fastnn.engine.cuda_engine) failed to import: {exc}") from exc
    return CudaEngine


def create_engine(device: str, config: EngineConfig, state: dict[str, np.ndarray], *, stacklevel: int = 2) -> Engine:
    """Build the engine for `device` from `config`, starting from `state`.

    "auto" takes the GPU when it is usable, else the CPU with one warning (at `stacklevel`).

    Raises:
        ConfigError: `device` is not one of DEVICES.
        DeviceUnavailable: device="cuda" and no usable GPU.
    """
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        from .numpy_engine import NumpyEngine

        return NumpyEngine(config, state)
    if device == "cuda":
        try:
            engine_class = cuda_engine_class()
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(f"device='cuda': {exc}") from exc
        return engine_class(config, state)
    try:
        return cuda_engine_class()(config, state)
    except DeviceUnavailable as exc:
        warnings.warn(
            f"device='auto': {exc}; training on the CPU (NumPy engine) instead",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    from .numpy_engine import NumpyEngine

    return NumpyEngine(config, state)
