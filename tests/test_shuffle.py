"""fastnn._shuffle on the CPU: the seed as the kernels take it (two 32-bit halves), one helper for all callers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fastnn._shuffle import round_keys, split_u64

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
