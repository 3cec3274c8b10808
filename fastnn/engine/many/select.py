"""Which engine trains K models: the NumPy engine on the CPU; on a GPU the many-model GPU engine (`gpu/`).

device="auto" takes the GPU when it is usable, else the CPU with a warning, as `Trainer` does. The GPU modules
are imported only when a GPU is asked for.
"""

from __future__ import annotations

import numpy as np

from ..._errors import ConfigError, DeviceUnavailable
from ..select import DEVICES
from .base import ManyConfig, ManyEngine

__all__ = ["MANY_ENGINES", "check_many_engine", "create_many_engine"]

#: engine= of MultiTrainer: "auto" (the GPU engine on a GPU, NumPy on the CPU), "numpy" or "gpu".
MANY_ENGINES = ("auto", "numpy", "gpu")


def check_many_engine(device: object, engine: object) -> str:
    """`engine` validated against `device`.

    Raises:
        ConfigError: `device` or `engine` is not one of the choices, or they contradict each other.
    """
    if not isinstance(device, str) or device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    if not isinstance(engine, str) or engine not in MANY_ENGINES:
        raise ConfigError(f"engine must be one of {MANY_ENGINES}, got {engine!r}")
    if device == "cpu" and engine == "gpu":
        raise ConfigError("engine='gpu' trains on the GPU but device='cpu': use device='cuda' (or 'auto')")
    if device == "cuda" and engine == "numpy":
        raise ConfigError("engine='numpy' trains on the CPU but device='cuda': use device='cpu' (or 'auto')")
    return engine


def _gpu_engine(config: ManyConfig, states: list[dict[str, np.ndarray]], ordinal: int = 0) -> ManyEngine:
    """The GPU engine, if this machine can run it.

    Raises:
        DeviceUnavailable: no usable GPU, or the GPU modules cannot be imported.
    """
    from ..._device import cuda_status

    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(f"no usable GPU: {reason}")
    try:
        from .gpu import ManyGpuEngine
    except ImportError as exc:
        raise DeviceUnavailable(f"the many-model GPU engine (fastnn.engine.many.gpu) failed to import: {exc}") from exc
    return ManyGpuEngine(config, states, ordinal)


def create_many_engine(
    device: str, engine: str, config: ManyConfig, states: list[dict[str, np.ndarray]], warn: object = None,
    ordinal: int = 0,
) -> ManyEngine:
    """Build the engine for `device` and `engine` (on a GPU, the GPU `ordinal` of this process); `warn(message)` is
    called when device="auto" falls back to the CPU.

    Raises:
        DeviceUnavailable: device="cuda" (or engine="gpu") and no usable GPU.
    """
    check_many_engine(device, engine)
    if device == "cpu" or engine == "numpy":
        from .numpy_engine import ManyNumpyEngine

        return ManyNumpyEngine(config, states)
    if device == "cuda" or engine == "gpu":
        try:
            return _gpu_engine(config, states, ordinal)
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(f"device={device!r}, engine={engine!r}: {exc}") from exc
    try:
        return _gpu_engine(config, states, ordinal)
    except DeviceUnavailable as exc:
        if callable(warn):
            warn(f"device='auto': {exc}; training on the CPU (NumPy engine) instead")
    from .numpy_engine import ManyNumpyEngine

    return ManyNumpyEngine(config, states)
