"""The graph engine's buffer bookkeeping: element sizes, 256-byte rounding, an owner that frees what it holds in
reverse order, and one linear layer's device buffers and plans."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Layer", "Owner", "itemsize", "round256"]


def round256(n: int) -> int:
    """n rounded up to a multiple of 256 (bytes: cuBLASLt wants 256-byte aligned operands)."""
    return -(-int(n) // 256) * 256


def itemsize(t: type) -> int:
    """Bytes of one element of numpy type `t`."""
    return np.dtype(t).itemsize


class Owner:
    """Holds objects with close() and releases them in reverse order of creation."""

    def __init__(self) -> None:
        self._owned: list = []

    def own(self, obj):
        self._owned.append(obj)
        return obj

    def drop(self, obj) -> None:
        """Release one owned object now."""
        self._owned.remove(obj)
        obj.close()

    def release(self) -> None:
        while self._owned:
            self._owned.pop().close()


@dataclass
class Layer:
    """Device buffers and plans of one linear layer (plans keyed by batch rows)."""

    out: object  # Z (rows, d_out): post-activation for hidden layers, logits for the last
    dout: object | None = None  # dL/d(pre-activation) (rows, d_out); training only
    aux: object | None = None  # ReLU bit-mask or GELU pre-activation of hidden layers; training only
    fwd: dict = field(default_factory=dict)
    dw: dict = field(default_factory=dict)
    dx: dict = field(default_factory=dict)
