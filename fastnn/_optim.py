"""Optimizer descriptions and their one update rule (PyTorch's SGD and AdamW semantics).

The NumPy engine calls `sgd_step` / `adamw_step`; `native/optim.cuh` is the same arithmetic on the
GPU (every kernel's update calls it), and the GPU tests compare the two. Each optimizer describes itself
to the kernels by `kernel_params`, the fields of optim.cuh's OptimParams; the engines pack that, never
the optimizer's own fields. Weight decay applies to every parameter, biases included, as in PyTorch with
a single parameter group, unless `bias_decay` says otherwise: the decay of the biases (None, the default: the same
as weight_decay; fastnn.sklearn passes 0, as scikit-learn penalises coef_ / coefs_ only, never the intercepts).
Every engine applies it alike: the NumPy step below per parameter, the kernels through optim.cuh's optim_bias at
each bias update. Adding an optimizer: a class here (with its NumPy step and `kernel_params`),
its kind and update in native/optim.cuh, and its step in the NumPy engine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ._checks import number, shown
from ._errors import ConfigError

__all__ = ["OPTIMIZERS", "SGD", "AdamW", "KernelParams", "Optimizer", "adamw_step", "decay_of", "sgd_step"]

#: Optimizer kinds as the kernels number them (native/optim.cuh's OPTIM_SGD, OPTIM_ADAMW).
KIND_SGD = 0
KIND_ADAMW = 1
_C_TYPES = {"int": "i32", "float": "f32"}


@dataclass(frozen=True)
class KernelParams:
    """native/optim.cuh's OptimParams, field for field in its order (int fields are C int, float fields C float):
    all that a kernel knows of the optimizer besides the step's learning rate. Zero where an optimizer has no such
    field."""

    kind: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: int = 0
    beta1: float = 0.0
    beta2: float = 0.0
    eps: float = 0.0
    bias_decay: float = 0.0  # the weight_decay of the biases (optim.cuh's optim_bias)

    def for_bias(self) -> KernelParams:
        """These parameters as a bias is updated with them: weight_decay replaced by bias_decay (optim.cuh's
        optim_bias), for a kernel that updates biases in launches of their own (the graph engine's update.cu)."""
        return dataclasses.replace(self, weight_decay=self.bias_decay)

    def c_fields(self) -> tuple[tuple[str, str, int | float], ...]:
        """(name, C type, value) of each field in the struct's order, as `fastnn.cuda.driver.arg_struct` takes them."""
        return tuple((f.name, _C_TYPES[str(f.type)], getattr(self, f.name)) for f in dataclasses.fields(self))


def _f32(v: float) -> float:
    """v as the float32 the update kernels and the lr table use (inf where it overflows, 0 where it underflows)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(v))


def _check_lr(lr: object) -> float:
    v = number("lr", lr, "a finite number > 0", lambda v: v > 0)
    if not (math.isfinite(_f32(v)) and _f32(v) > 0):  # the rate every step uses is float32
        raise ConfigError(f"lr must be a number > 0 that is finite and nonzero in float32, got {shown(lr)}")
    return v


def _check_range(name: str, value: object, lo: float, hi: float, hi_open: bool = False) -> float:
    """A float in [lo, hi] (or [lo, hi)), also after rounding to float32: 0.9999999999 rounds to 1.0."""
    rule = f"a number in [{lo}, {hi}{')' if hi_open else ']'}"
    v = number(name, value, rule)
    for u in (v, _f32(v)):
        if not math.isfinite(u) or u < lo or (u >= hi if hi_open else u > hi):
            raise ConfigError(f"{name} must be {rule}, also in float32, got {shown(value)}")
    return v


def _check_bias_decay(value: object) -> float | None:
    return None if value is None else _check_range("bias_decay", value, 0.0, 1e6)


def decay_of(opt: Optimizer, is_bias: bool) -> float:
    """The weight decay `opt` applies to a weight (is_bias False) or a bias: bias_decay, where given, for biases."""
    return opt.weight_decay if not is_bias or opt.bias_decay is None else opt.bias_decay


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay (`bias_decay`: the
    biases' own decay; None = weight_decay, as PyTorch with one parameter group)."""

    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    bias_decay: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _check_lr(self.lr))
        object.__setattr__(self, "momentum", _check_range("momentum", self.momentum, 0.0, 1.0, True))
        object.__setattr__(self, "weight_decay", _check_range("weight_decay", self.weight_decay, 0.0, 1e6))
        if not isinstance(self.nesterov, (bool, np.bool_)):
            raise ConfigError(f"nesterov must be True or False, got {self.nesterov!r}")
        object.__setattr__(self, "nesterov", bool(self.nesterov))
        object.__setattr__(self, "bias_decay", _check_bias_decay(self.bias_decay))
        if self.nesterov and self.momentum == 0.0:
            raise ConfigError("nesterov=True needs momentum > 0, got momentum=0.0")

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum > 0 else ()

    def kernel_params(self) -> KernelParams:
        """This optimizer as the GPU kernels take it (native/optim.cuh's OptimParams)."""
        return KernelParams(KIND_SGD, self.momentum, self.weight_decay, nesterov=int(self.nesterov),
                            bias_decay=decay_of(self, True))  # fmt: skip


@dataclass(frozen=True)
class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter), as `torch.optim.AdamW` (`bias_decay`: the biases'
    own decay; None = weight_decay)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    bias_decay: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _check_lr(self.lr))
        try:
            b1, b2 = self.betas
        except (TypeError, ValueError):
            raise ConfigError(f"betas must be a pair of numbers in [0, 1), got {self.betas!r}") from None
        object.__setattr__(
            self, "betas", (_check_range("betas[0]", b1, 0.0, 1.0, True), _check_range("betas[1]", b2, 0.0, 1.0, True))
        )
        eps = _check_range("eps", self.eps, 0.0, 1.0)
        if _f32(eps) <= 0:
            raise ConfigError(f"eps must be > 0, also in float32, got {shown(self.eps)}")
        object.__setattr__(self, "eps", eps)
        object.__setattr__(self, "weight_decay", _check_range("weight_decay", self.weight_decay, 0.0, 1e6))
        object.__setattr__(self, "bias_decay", _check_bias_decay(self.bias_decay))

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def kernel_params(self) -> KernelParams:
        """This optimizer as the GPU kernels take it (native/optim.cuh's OptimParams)."""
        b1, b2 = self.betas
        return KernelParams(KIND_ADAMW, weight_decay=self.weight_decay, beta1=b1, beta2=b2, eps=self.eps,
                            bias_decay=decay_of(self, True))  # fmt: skip


Optimizer = SGD | AdamW
#: Every optimizer class, as Trainer accepts them and checkpoints name them.
OPTIMIZERS: tuple[type, ...] = (SGD, AdamW)


def sgd_step(opt: SGD, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray], lr: float,
             is_bias: bool = False) -> None:  # fmt: skip
    """One in-place SGD step on `w` (float32 arrays), as torch.optim.SGD with dampening 0; `is_bias`: decayed by
    bias_decay."""
    decay = decay_of(opt, is_bias)
    if decay:
        g = g + decay * w
    if opt.momentum:
        buf = state["momentum"]
        buf *= opt.momentum
        buf += g
        g = g + opt.momentum * buf if opt.nesterov else buf
    w -= lr * g


def adamw_step(opt: AdamW, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray], lr: float, t: int,
               is_bias: bool = False) -> None:  # fmt: skip
    """One in-place AdamW step; `t` counts steps from 1 (bias correction); `is_bias`: decayed by bias_decay."""
    b1, b2 = opt.betas
    m, v = state["exp_avg"], state["exp_avg_sq"]
    w *= 1.0 - lr * decay_of(opt, is_bias)
    m *= b1
    m += (1.0 - b1) * g
    v *= b2
    v += (1.0 - b2) * g * g
    c1 = 1.0 - b1**t
    c2 = 1.0 - b2**t
    w -= (lr / c1) * m / (np.sqrt(v / c2) + opt.eps)
