"""Which engine trains: `device` ("cpu", "cuda" or "auto") and, on a GPU, `engine` ("fused", "grid", "graph" or
"auto").

The NumPy engine trains on the CPU. On a GPU, the graph engine (`graph/`, one CUDA graph of library calls per
epoch) trains any model; the fused engine (`fused/`, one persistent kernel per epoch with the weights on chip)
trains the small models it can hold, faster; the grid engine (`grid/`, one cooperative persistent kernel over up
to every SM) trains MLPs with hidden layers and is meant for mid and wide ones at small batches. "auto" takes the
fused engine where it holds the model and its measured rule (`fused.prefer_fused`) says it is faster (where the
grid engine's rule holds too, only on a fast fused kernel: `fused.fast_kernel_serves`), else the
grid engine where it serves the model and its rule (`grid.prefer_grid`, data in tuning.GRID_RULE) says so, else
the graph engine. The engine is chosen here, once, when the trainer is made, before any data is seen; the one
choice data makes later is the auto-chosen grid engine's, per training set (`GridEngine.step_for`: the graph engine's
step for a set its kernels cannot serve), and the engine's `name` (`Trainer.engine`) then says "graph". So too a
weighted fit (`Trainer.fit(sample_weight=...)` with unequal weights) on an auto-chosen fused or grid engine: its
kernels compute the unweighted mean, so that fit trains with the graph engine's step (weighted loss kernels), and the
next unweighted fit goes back to the kernel; engine="fused" or "grid" refuses unequal weights by name. Several GPUs
of one process get the replica engine (`replicas.py`). The GPU modules are
imported only when a GPU is asked for, so CPU training never needs them. A new engine joins as a package beside
these, with its name in ENGINES (and KERNEL_ENGINES, with a branch in `_kernel_engine`, if it has an
`unsupported_reason` and a rule).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable

import numpy as np

from .._errors import ConfigError, DeviceUnavailable
from .._warn import warn_at_caller
from .base import Engine, EngineConfig

__all__ = [
    "DEVICES", "ENGINES", "EngineRefused", "check_devices", "check_distributed", "check_engine", "choose_gpu_engine",
    "create_engine", "graph_engine_class",
]  # fmt: skip

DEVICES = ("auto", "cpu", "cuda")
MAX_GPUS = 1024  # a bound on devices= well above any machine's GPU count, checked before a list is built
ENGINES = ("auto", "fused", "grid", "graph")
#: The persistent-kernel engines, in the order engine="auto" considers them (each with its package's rule).
KERNEL_ENGINES = ("fused", "grid")

_warned: set[str] = set()  # the fallback warnings this process has shown


def _warn_once(message: str, stacklevel: int) -> None:
    """Warn (RuntimeWarning) the first time this process meets `message`: a grid search makes a trainer per fit,
    and the same fallback said once is news, said at every fit noise."""
    if message in _warned:
        return
    _warned.add(message)
    warn_at_caller(message, RuntimeWarning)  # the user's line, whatever `stacklevel` the path counted


class EngineRefused(ConfigError):
    """engine="fused" or "grid" was asked for a model it cannot serve; the message names the limit. A ConfigError, so
    `Trainer.load` can tell the caller's engine choice apart from a bad value in the file."""


def check_engine(device: str, engine: object) -> str:
    """`engine` validated against `device`: a GPU engine cannot be forced on device="cpu".

    Raises:
        ConfigError: `engine` is not one of ENGINES, or names a GPU engine with device="cpu".
    """
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if device == "cpu" and engine != "auto":
        raise ConfigError(f"engine={engine!r} is a GPU engine but device='cpu': use device='cuda' (or 'auto')")
    return engine


def choose_gpu_engine(engine: str, unsupported: str | None, fused_faster: bool,
                      grid_unsupported: str | None = "not considered", grid_faster: bool = False) -> str:  # fmt: skip
    """"fused", "grid" or "graph" for a GPU run.

    `unsupported` / `grid_unsupported` say why the fused / grid engine cannot serve the model (None when it can);
    `fused_faster` / `grid_faster` are their measured rules' verdicts. A forced choice is kept; a forced engine
    that cannot serve the model raises. "auto": fused where it serves and its rule says so, else grid likewise,
    else graph.

    Raises:
        EngineRefused: engine="fused" or "grid" cannot serve the model (the message names the limit).
    """
    if engine == "graph":
        return "graph"
    for name, reason in (("fused", unsupported), ("grid", grid_unsupported)):
        if engine == name:
            if reason is not None:
                raise EngineRefused(f"engine='{name}' cannot train this model: {reason}")
            return name
    if unsupported is None and fused_faster:
        return "fused"
    return "grid" if grid_unsupported is None and grid_faster else "graph"


def graph_engine_class() -> type[Engine]:
    """The graph engine class, if this machine can run it.

    Raises:
        DeviceUnavailable: no usable GPU, or the GPU modules cannot be imported; the message says which.
    """
    try:
        from .._device import cuda_status
    except ImportError as exc:
        raise DeviceUnavailable(f"fastnn._device failed to import: {exc}") from exc
    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(f"no usable GPU: {reason}")
    try:
        from .graph import GraphEngine
    except ImportError as exc:
        raise DeviceUnavailable(f"the graph engine (fastnn.engine.graph) failed to import: {exc}") from exc
    return GraphEngine


def _gpu_engine(
    graph_class: type[Engine], config: EngineConfig, state: dict[str, np.ndarray], engine: str, ordinal: int = 0,
    stacklevel: int = 1,
) -> Engine:
    """The GPU engine `engine` resolves to (see `choose_gpu_engine`) on GPU `ordinal`, from `config` and `state`.

    A kernel engine whose module fails to import is an incomplete installation, not a choice: engine="auto" goes on
    without it and warns once (at `stacklevel` above the caller) naming the module; a forced one is refused.
    """
    if engine == "graph":
        return graph_class(config, state, ordinal)
    engines: dict[str, tuple[type[Engine], Callable]] = {}
    for name in KERNEL_ENGINES:
        if engine in ("auto", name):
            try:
                engines[name] = _kernel_engine(name)
            except ImportError as exc:
                if engine == name:
                    raise EngineRefused(f"engine={name!r} is unavailable: {exc}") from exc
                _warn_once(f"fastnn.engine.{name} failed to import ({exc}): this fastnn installation is incomplete, "
                           f"so engine='auto' trains without the {name} engine (slower where it would be chosen); "
                           f"reinstall fastnn. `fastnn info` lists the engines that import", stacklevel + 1)
    if not engines:
        return graph_class(config, state, ordinal)
    from ..cuda import driver

    dev = driver.get_device(ordinal)
    verdicts = {"fused": ("not considered", False), "grid": ("not considered", False)}
    for name, (cls, rule) in engines.items():
        faster = bool(rule(config, dev))
        if engine == "auto" and not faster:  # its measured rule says no: whether it could serve does not matter
            continue
        reason = cls.unsupported_reason(config, dev)
        verdicts[name] = (reason, reason is None and faster)
    if engine == "auto" and verdicts["fused"][1] and verdicts["grid"][1]:
        # Both rules hold (h = 128): the fused engine's generic fused.cu (~39 us/step at 784-128x3-10 with SGD, 72
        # with AdamW; H100) is slower than grid_fast.cu (~11-12 with SGD, ~38 with AdamW at h = 256), so the fused
        # engine keeps the model only where one of its fast kernels serves it (tuning.py says more).
        from .fused import fast_kernel_serves

        if not fast_kernel_serves(config, dev):
            verdicts["fused"] = (verdicts["fused"][0], False)
    choice = choose_gpu_engine(engine, *verdicts["fused"], *verdicts["grid"])
    if choice in engines:
        if engine == "auto":  # chosen for its fast kernel: the graph step trains what that cannot (a weighted fit;
            # the grid engine: data never grid.cu's)
            return engines[choice][0](config, state, ordinal, graph_fallback=True)
        return engines[choice][0](config, state, ordinal)
    return graph_class(config, state, ordinal)


def _kernel_engine(name: str) -> tuple[type[Engine], Callable]:
    """The engine class of a persistent-kernel engine and its rule for engine="auto" (imported on first use)."""
    if name == "fused":
        from .fused import FusedEngine, prefer_fused

        return FusedEngine, prefer_fused
    from .grid import GridEngine, prefer_grid

    return GridEngine, prefer_grid


def _on_gpus(config: EngineConfig, state: dict[str, np.ndarray], engine: str, ordinals: list[int]) -> Engine:
    """The engine for devices=`ordinals` (other than the default [0], or with Tuning.one_gpu_replica): one GPU's
    engine on that GPU, or a replica of the graph engine on each GPU (`replicas.ReplicaEngine`).

    Raises:
        DeviceUnavailable: no usable GPU, an ordinal with no GPU, or NCCL missing for several.
    """
    try:
        engine_class = graph_engine_class()
    except DeviceUnavailable as exc:
        raise DeviceUnavailable(f"devices={ordinals!r}: {exc}") from exc
    from ..cuda import driver

    count = driver.device_count()
    missing = [d for d in ordinals if d >= count]
    if missing:
        raise DeviceUnavailable(f"devices={ordinals!r}: this machine has {count} GPU(s), numbered from 0; there is "
                                f"no GPU {', '.join(map(str, missing))}")  # fmt: skip
    if len(ordinals) == 1 and not (config.tuning.one_gpu_replica and engine not in KERNEL_ENGINES):
        return _gpu_engine(engine_class, config, state, engine, ordinals[0])
    from .replicas import ReplicaEngine

    return ReplicaEngine(config, state, ordinals)


def check_distributed(device: str, engine: str, group: object) -> None:
    """A data-parallel `group` (fastnn.distributed.Group, defined in engine/group.py) is for the graph engine on a GPU.

    Raises:
        ConfigError: `group` is not a Group, or device="cpu", or engine="fused" or "grid" (one GPU's kernel).
    """
    if group is None:
        return
    from .group import Group

    if not isinstance(group, Group):
        raise ConfigError(f"distributed must be a fastnn.distributed.Group from fastnn.distributed.init(), got "
                          f"{type(group).__name__}")  # fmt: skip
    if device == "cpu":
        raise ConfigError("distributed training runs on GPUs: device='cpu' cannot take distributed=")
    if engine in KERNEL_ENGINES:
        raise ConfigError(f"engine={engine!r} trains on one GPU (one persistent kernel): distributed= needs "
                          "engine='graph' or 'auto'")  # fmt: skip


def check_devices(device: str, engine: str, devices: object, group: object = None) -> list[int]:
    """`devices` as the GPU ordinals to train on: N (the first N GPUs) or a list of distinct ordinals.

    Raises:
        ConfigError: not a positive integer nor a non-empty list of distinct non-negative integers; or several
            GPUs with device="cpu", engine="fused" or "grid" (one GPU's kernel) or a `distributed=` group (a process
            per GPU already).
    """

    def is_int(v: object) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    if is_int(devices) and 1 <= devices <= MAX_GPUS:
        ordinals = list(range(int(devices)))
    elif isinstance(devices, (list, tuple)) and 0 < len(devices) <= MAX_GPUS and all(
        is_int(d) and 0 <= d < MAX_GPUS for d in devices
    ):
        ordinals = [int(d) for d in devices]
        if len(set(ordinals)) != len(ordinals):
            raise ConfigError(f"devices lists a GPU twice: {list(devices)!r} (one replica per GPU)")
    else:
        raise ConfigError(f"devices must be a number of GPUs in [1, {MAX_GPUS}] or a non-empty list of distinct GPU "
                          f"ordinals below {MAX_GPUS}, got {reprlib.repr(devices)}")  # fmt: skip
    if group is not None and not (is_int(devices) and devices == 1):
        raise ConfigError(f"devices={devices!r} with distributed=: a distributed run has one process per GPU, each "
                          "on its group's GPU; pass one or the other")  # fmt: skip
    if ordinals == [0]:
        return ordinals
    if device == "cpu":
        raise ConfigError(f"devices={devices!r} names GPUs but device='cpu': use device='cuda' (or 'auto')")
    if engine in KERNEL_ENGINES and len(ordinals) > 1:
        raise ConfigError(f"engine={engine!r} trains on one GPU (one persistent kernel): devices={devices!r} needs "
                          "engine='graph' or 'auto'")  # fmt: skip
    return ordinals


def _warn_if_one_gpu_is_faster(config: EngineConfig, world: int, stacklevel: int) -> None:
    """Warn once when `world` GPUs are estimated to train this model slower than one (engine/scaling.py)."""
    from .scaling import grad_bytes_of, one_gpu_is_faster

    slower, saved, cost = one_gpu_is_faster(list(config.model.sizes), config.batch_size, world,
                                            grad_bytes_of(config.precision))  # fmt: skip
    if slower:
        _warn_once(f"data parallelism on {world} GPUs will likely train this model slower than one GPU: splitting a "
                   f"batch of {config.batch_size} saves about {saved * 1e6:.1f} us of GEMMs a step, summing its "
                   f"gradients costs about {cost * 1e6:.1f} us (fastnn/engine/scaling.py). To use several GPUs for "
                   "small models, train many models at once (fastnn.MultiTrainer, one per GPU) instead",
                   stacklevel + 1)  # fmt: skip


def create_engine(
    device: str, config: EngineConfig, state: dict[str, np.ndarray], *, engine: str = "auto", stacklevel: int = 2,
    group: object = None, devices: object = 1,
) -> Engine:
    """Build the engine for `device` and `engine` from `config`, starting from `state`.

    device="auto" takes the GPU when it is usable, else the CPU with a warning (at `stacklevel`, once per process).
    Every engine trains every loss of base.LOSSES. With a data-parallel `group` it is the graph engine on the group's
    GPU, or DeviceUnavailable. `devices` other than the first GPU alone need GPUs (no fallback to the CPU): one GPU's
    engine there, or a replica on each (on one GPU too with config.tuning.one_gpu_replica).

    Raises:
        ConfigError: `device`, `engine` or `devices` is invalid, or engine="fused"/"grid" cannot serve the model.
        DeviceUnavailable: device="cuda" (or devices naming GPUs) and no usable GPU; several GPUs and no NCCL.
    """
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    check_engine(device, engine)
    check_distributed(device, engine, group)
    ordinals = check_devices(device, engine, devices, group)
    world = len(ordinals) if group is None else int(getattr(group, "world", 1))
    if world > 1:
        _warn_if_one_gpu_is_faster(config, world, stacklevel + 1)
    if ordinals != [0] or (config.tuning.one_gpu_replica and device != "cpu" and group is None):
        return _on_gpus(config, state, engine, ordinals)
    if group is not None:
        try:
            return graph_engine_class()(config, state, group=group)
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(f"distributed=: {exc}") from exc
    if device == "cpu":
        from .numpy_engine import NumpyEngine

        return NumpyEngine(config, state)
    if device == "cuda":
        try:
            engine_class = graph_engine_class()
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(f"device='cuda': {exc}") from exc
        return _gpu_engine(engine_class, config, state, engine, stacklevel=stacklevel + 1)
    try:
        return _gpu_engine(graph_engine_class(), config, state, engine, stacklevel=stacklevel + 1)
    except DeviceUnavailable as exc:
        _warn_once(f"device='auto': {exc}; training on the CPU (NumPy engine) instead", stacklevel + 1)
    from .numpy_engine import NumpyEngine

    return NumpyEngine(config, state)
