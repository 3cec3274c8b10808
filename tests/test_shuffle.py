"""fastnn._shuffle on the CPU: the seed as the kernels take it (two 32-bit halves), one helper for all callers; each
epoch's order a permutation, a new one each epoch; native/shuffle.cuh's order the same (compiled for the host)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fastnn._shuffle as shuffle
from fastnn._shuffle import feistel_bits, permutation, permuted_index, round_keys, split_u64

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "value, halves",
    [(0, (0, 0)), (2**32 - 1, (2**32 - 1, 0)), (2**32, (0, 1)), (0x0123_4567_89AB_CDEF, (0x89AB_CDEF, 0x0123_4567)),
     (2**64 - 1, (2**32 - 1, 2**32 - 1))],
)  # fmt: skip
def test_split_u64_gives_low_then_high_half(value, halves):
    assert split_u64(value) == halves


def test_round_keys_use_both_halves_of_the_seed():
    assert not (round_keys(1, 0) == round_keys(1 + 2**32, 0)).all()
    assert not (round_keys(2**32, 0) == round_keys(2**33, 0)).all()


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "fastnn").rglob("*.py")))
def test_no_module_splits_a_64_bit_value_by_hand(path):
    """A 64-bit value's high half, `x >> 32`, is taken in split_u64 only."""
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.RShift) and isinstance(node.right, ast.Constant):
            assert node.right.value != 32 or path == "fastnn/_shuffle.py", (path, node.lineno)


# ---- the order itself: a permutation, a new one each epoch -------------------------------------------------------

SIZES = [1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097, 60_000]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed,epoch", [(0, 0), (7, 3), (2**64 - 1, 2**32 - 1)])
def test_each_epochs_order_is_a_permutation(n: int, seed: int, epoch: int) -> None:
    order = permutation(seed, epoch, n)
    assert order.dtype == np.int64 and order.shape == (n,)
    assert (np.sort(order) == np.arange(n)).all()


def test_any_positions_read_the_same_order() -> None:
    """permuted_index at chosen positions (a gather's rows) agrees with the whole permutation."""
    order = permutation(5, 2, 1000)
    positions = np.array([999, 0, 500, 1, 1, 998], dtype=np.uint32)
    assert (permuted_index(5, 2, 1000, positions) == order[positions]).all()


@pytest.mark.parametrize("n", [10, 1000, 60_000])
def test_the_order_differs_per_epoch_and_per_seed_and_repeats_for_the_same_key(n: int) -> None:
    orders = [permutation(3, e, n) for e in range(8)] + [permutation(s, 0, n) for s in (4, 3 + 2**32)]
    assert all((permutation(3, e, n) == orders[e]).all() for e in range(8))  # keyed: the same key, the same order
    for i in range(len(orders)):
        for j in range(i):
            same = int((orders[i] == orders[j]).sum())
            assert same < n, (i, j)  # a different order
            if n >= 1000:  # and unrelated: about one position in common (n of them at random: 1 expected)
                assert same <= 12, (i, j, same)
    assert (orders[0] != np.arange(n)).any()


def test_a_round_that_does_not_permute_fails_instead_of_walking_forever(monkeypatch) -> None:
    """Cycle-walking a non-bijection may never come back below n: the walk is bounded and says why it stopped."""
    monkeypatch.setattr(shuffle, "feistel", lambda values, keys, bits: np.full_like(values, (1 << bits) - 1))
    with pytest.raises(RuntimeError, match=r"not a bijection of \[0, 2\*\*4\).*n=9"):
        permutation(0, 0, 9)


# ---- native/shuffle.cuh gives the same order (compiled for the host: its arithmetic is plain uint32) -------------

_HOST_MAIN = r"""
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <cstdlib>
#include "shuffle.cuh"
int main(int argc, char** argv) {
    u32 seed_lo = strtoul(argv[1], 0, 10), seed_hi = strtoul(argv[2], 0, 10), epoch = strtoul(argv[3], 0, 10);
    u32 n = strtoul(argv[4], 0, 10), half_bits = strtoul(argv[5], 0, 10), keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, epoch, keys);
    for (u32 p = 0; p < n; ++p) printf("%u\n", permuted_index(keys, half_bits, n, p));
    return 0;
}
"""


def test_shuffle_cuh_gives_the_python_order(tmp_path: Path) -> None:
    """The kernels' order (native/shuffle.cuh) is fastnn._shuffle's, on the CPU: the header compiled as host C++
    beside a stand-in for common.cuh (its u32 only; the real one holds device-only code)."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) to build native/shuffle.cuh for the host")
    shutil.copy(REPO / "native" / "shuffle.cuh", tmp_path / "shuffle.cuh")
    (tmp_path / "common.cuh").write_text("#pragma once\ntypedef unsigned int u32;\n")
    (tmp_path / "main.cpp").write_text(_HOST_MAIN)
    exe = tmp_path / "order"
    subprocess.run([compiler, "-O1", "-o", str(exe), str(tmp_path / "main.cpp")], check=True, capture_output=True)
    keys = [(0, 0, 1), (0, 0, 10), (7, 3, 1000), (2**64 - 1, 2**32 - 1, 4097), (0x0123_4567_89AB_CDEF, 9, 60_000)]
    for seed, epoch, n in keys:
        lo, hi = split_u64(seed)
        out = subprocess.run([str(exe), str(lo), str(hi), str(epoch), str(n), str(feistel_bits(n) // 2)],
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        assert (np.array(out.split(), dtype=np.int64) == permutation(seed, epoch, n)).all(), (seed, epoch, n)
