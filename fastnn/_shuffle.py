"""The one definition of sample order: a keyed bijection of [0, n) for each (seed, epoch).

Position p of epoch e reads sample `permuted_index(seed, e, n, p)`. The bijection is a balanced
Feistel network on the smallest even number of bits that covers n, made a bijection of [0, n) by
cycle-walking (apply again while the value is >= n; the domain is < 4n, so few walks are needed).
It needs no sort and no table, so the GPU computes index p of the permutation directly from
(seed, epoch, p) in its gather kernel: `native/shuffle.cuh` is the same arithmetic in C, and the
GPU tests check that both give the same order. All arithmetic is on uint32, wrapping.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ROUNDS", "feistel", "feistel_bits", "permutation", "permuted_index", "round_keys", "split_u64"]

ROUNDS = 6
_M32 = 0xFFFFFFFF


def _mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 (Wellons): a well-mixing bijection of uint32."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def split_u64(value: int) -> tuple[int, int]:
    """The (low, high) 32-bit halves of an int in [0, 2**64): the seed as round_keys and the kernels take it (two
    uint32 arguments), and 64-bit counters as float64 holds them exactly."""
    return value & _M32, (value >> 32) & _M32


def round_keys(seed: int, epoch: int) -> np.ndarray:
    """The ROUNDS uint32 round keys of (seed, epoch); seed is any int in [0, 2**64)."""
    seed_lo, seed_hi = split_u64(seed)
    with np.errstate(over="ignore"):
        k = _mix32(np.array([seed_lo ^ 0x9E3779B9], dtype=np.uint32))
        k = _mix32(k ^ np.uint32(seed_hi))
        k = _mix32(k ^ np.uint32(epoch & _M32))
        r = np.arange(ROUNDS, dtype=np.uint32)
        return _mix32(k + r * np.uint32(0x632BE5AB))


def feistel_bits(n: int) -> int:
    """The smallest even bit count b >= 2 with 2**b >= n."""
    b = max(2, (n - 1).bit_length())
    return b + (b & 1)


def permuted_index(seed: int, epoch: int, n: int, positions: np.ndarray) -> np.ndarray:
    """The sample index at each position (int64 array of values in [0, n)) of epoch `epoch`."""
    if n < 1 or n > 2**31:
        raise ValueError(f"n must be in [1, 2**31], got {n}")
    keys, bits = round_keys(seed, epoch), feistel_bits(n)
    x = np.asarray(positions, dtype=np.uint32).copy()
    todo = np.ones(x.shape, dtype=bool)
    # A bijection of [0, 2**bits) brings every position back below n within 2**bits - n + 1 walks (the values it
    # passes through before are distinct and >= n); more means the rounds no longer permute: fail, never loop.
    for _ in range((1 << bits) - n + 1):
        if not todo.any():
            break
        v = feistel(x[todo], keys, bits)
        x[todo] = v
        todo[todo] = v >= n
    if todo.any():
        stuck = int(np.asarray(positions).reshape(-1)[np.argmax(todo)])
        raise RuntimeError(f"the shuffle's Feistel rounds are not a bijection of [0, 2**{bits}): cycle-walking "
                           f"position {stuck} of n={n} does not come back below n")  # fmt: skip
    return x.astype(np.int64)


def feistel(values: np.ndarray, keys: np.ndarray, bits: int) -> np.ndarray:
    """One pass of the ROUNDS-round balanced Feistel network: a keyed bijection of [0, 2**bits) (uint32 arrays)."""
    half = np.uint32(bits // 2)
    mask = np.uint32((1 << int(half)) - 1)
    left, right = values >> half, values & mask
    with np.errstate(over="ignore"):
        for key in keys:
            left, right = right, left ^ (_mix32(right ^ key) & mask)
    return (left << half) | right


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The whole order of epoch `epoch`: a permutation of range(n) as int64."""
    return permuted_index(seed, epoch, n, np.arange(n, dtype=np.uint32))
