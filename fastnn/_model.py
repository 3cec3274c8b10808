"""The model description (`MLP`) and its one initialisation, shared by every engine."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._checks import shown
from ._errors import ConfigError

__all__ = ["ACTIVATIONS", "MAX_PARAMETERS", "MLP", "init_parameters", "param_names"]

#: The largest model fastnn builds: 8 GiB of float32 weights, before gradients and optimizer state. It keeps
#: every layer width below 2**30, so sizes crossing into C as 32-bit ints (kernels, cuBLASLt leading dims) fit.
MAX_PARAMETERS = 2**31

#: Hidden-layer activations. "gelu" is the tanh approximation, the form cuBLASLt's epilogue computes.
ACTIVATIONS = ("relu", "gelu")


@dataclass(frozen=True)
class MLP:
    """A multi-layer perceptron: `sizes[0]` inputs, hidden layers, `sizes[-1]` outputs (the classes of a
    classifier, >= 2, or the k targets of a regression, `Trainer(loss="mse")`).

    `MLP([784, 10])` is logistic regression; the activation follows every layer but the last, which is linear.
    """

    sizes: tuple[int, ...]
    activation: str = "relu"

    def __init__(self, sizes: Sequence[int], activation: str = "relu") -> None:
        try:
            given = tuple(sizes)  # once: a generator would be empty on a second pass
            sizes_t = tuple(int(s) for s in given)
            ok = all(int(s) == s and not isinstance(s, (bool, np.bool_)) for s in given)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"sizes must be a sequence of positive integers, got {sizes!r}") from None
        if not ok or len(sizes_t) < 2 or any(s < 1 for s in sizes_t):
            raise ConfigError(f"sizes must hold at least two positive integers, got {sizes!r}")
        wide = [i for i, s in enumerate(sizes_t) if s >= 2**64]
        if wide:  # alone, before the product below: 10**400 squared overflows a float in _bytes' message
            raise ConfigError(
                f"sizes[{wide[0]}] = {shown(sizes_t[wide[0]])} is wider than a 64-bit machine can address: at most "
                f"2**31 parameters are supported"
            )
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        params = sum(i * o + o for i, o in zip(sizes_t[:-1], sizes_t[1:]))
        if params > MAX_PARAMETERS:  # refused before anything is allocated
            raise ConfigError(
                f"sizes={list(sizes_t)} make {params:,} parameters, {_bytes(4 * params)} as float32 weights alone "
                f"(gradients and optimizer state need as much again each): at most 2**31 parameters "
                f"({_bytes(4 * MAX_PARAMETERS)}) are supported"
            )
        object.__setattr__(self, "sizes", sizes_t)
        object.__setattr__(self, "activation", activation)

    @property
    def in_features(self) -> int:
        return self.sizes[0]

    @property
    def classes(self) -> int:
        """The number of outputs: the classes of a classifier, the targets of a regression."""
        return self.sizes[-1]

    @property
    def depth(self) -> int:
        """Number of hidden layers (0 for logistic regression)."""
        return len(self.sizes) - 2

    @property
    def layers(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of each linear layer."""
        return list(zip(self.sizes[:-1], self.sizes[1:]))

    def num_parameters(self) -> int:
        return sum(i * o + o for i, o in self.layers)


def param_names(model: MLP) -> list[str]:
    """Parameter names in the order of `torch.nn.Sequential(Linear, act, Linear, ...)`'s state_dict."""
    names = []
    for i in range(len(model.layers)):
        names += [f"{2 * i}.weight", f"{2 * i}.bias"]
    return names


def init_parameters(model: MLP, seed: int) -> dict[str, np.ndarray]:
    """PyTorch's `nn.Linear` default init, drawn on the host from `Generator(PCG64(seed))`.

    Weights are (out, in) like torch; Kaiming-uniform with a=sqrt(5) reduces to U(-1/sqrt(in), 1/sqrt(in)),
    and the bias uses the same bound. Layer by layer, weight then bias, so every engine (and a torch
    model loaded from `state_dict()`) starts from the same numbers. A large model is drawn by several threads,
    each from its own place in that one stream (`_draw`): the same numbers, sooner.
    """
    params: dict[str, np.ndarray] = {}
    spans: list[tuple[np.ndarray, float]] = []  # (flat view of a tensor, its bound), in the stream's order
    names = iter(param_names(model))
    for fan_in, fan_out in model.layers:
        bound = 1.0 / math.sqrt(fan_in)
        for shape in ((fan_out, fan_in), (fan_out,)):
            out = params[next(names)] = np.empty(shape, dtype=np.float32)
            spans.append((out.reshape(-1), bound))
    _draw(seed, spans, _init_workers(model.num_parameters()))
    return params


#: Draws per piece in _uniform_f32: 512 KiB of float64, which stays in the CPU's cache until it is cast.
_INIT_CHUNK = 1 << 16
#: Parameters per drawing thread: below this a thread's start costs more than its share of the draw. The draw
#: takes ~3 ns a value on one core (MLP 784-8192x3-10, 141M values: ~0.45 s, plus the first touch of 0.56 GB).
_INIT_PER_THREAD = 1 << 22
#: Most threads that draw (memory bandwidth, not cores, bounds the draw beyond this).
_INIT_MAX_THREADS = 8


def _init_workers(count: int) -> int:
    """Threads to draw `count` values with: one per _INIT_PER_THREAD values, at most the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(count // _INIT_PER_THREAD, cpus, _INIT_MAX_THREADS))


def _draw(seed: int, spans: list[tuple[np.ndarray, float]], workers: int) -> None:
    """Fill each flat float32 span with U(-bound, bound) from one PCG64(seed) stream, spans back to back.

    Generator.uniform takes exactly one 64-bit output of PCG64 per double (`(next >> 11) * 2**-53`, scaled), so
    value k of the stream is output k, and `PCG64.advance(k)` jumps there: each of `workers` threads draws its
    contiguous part of the stream from a generator advanced to that part's start, bit for bit the values one
    generator gives in order. NumPy releases the GIL while it draws and casts."""
    total = sum(flat.size for flat, _ in spans)
    if workers <= 1:
        _draw_part(seed, spans, 0, total)
        return
    import threading  # only a large model's init draws on threads

    step = -(-total // workers)
    errors: list[BaseException] = []

    def part(start: int) -> None:  # a worker's share
        try:
            _draw_part(seed, spans, start, min(start + step, total))
        except BaseException as exc:  # MemoryError, or a NumPy change: raised below, on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=part, args=(s,), name="fastnn-init") for s in range(step, total, step)]
    for t in threads:
        t.start()
    try:
        _draw_part(seed, spans, 0, min(step, total))  # the caller's own share: an interrupt here propagates as is
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def _draw_part(seed: int, spans: list[tuple[np.ndarray, float]], start: int, stop: int) -> None:
    """Values [start, stop) of the stream `_draw` describes, into their places in `spans`."""
    bits = np.random.PCG64(seed)
    if start:
        bits.advance(start)
    rng = np.random.Generator(bits)
    offset = 0  # stream position of the current span's first value
    for flat, bound in spans:
        lo, hi = max(start, offset), min(stop, offset + flat.size)
        if lo < hi:
            _uniform_f32(rng, bound, flat[lo - offset : hi - offset])
        offset += flat.size
        if offset >= stop:
            break


def _uniform_f32(rng: np.random.Generator, bound: float, out: np.ndarray) -> None:
    """`out[...] = rng.uniform(-bound, bound, size=out.size).astype(np.float32)` for a flat float32 `out`, bit for
    bit, drawn in pieces: uniform draws one double after another, so pieces draw the same doubles, and no float64
    array of the whole tensor is made (for MLP 784-8192x3-10 that was 1.1 GB of memory written, then read again by
    the cast: ~5x slower)."""
    for start in range(0, out.size, _INIT_CHUNK):
        out[start : start + _INIT_CHUNK] = rng.uniform(-bound, bound, size=min(_INIT_CHUNK, out.size - start))


def _bytes(n: int) -> str:
    """n bytes, also in the largest binary unit that keeps the number >= 1."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n:,} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n:,} bytes"
