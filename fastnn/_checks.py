"""The one check of a number the user gives: a float or an int, refused by name with a ConfigError otherwise.

Python numbers reach fastnn in forms `float()` and `math.isfinite` choke on: ints too large for a float
(`10**400` raises OverflowError), `fractions.Fraction` (NumPy's ufuncs raise TypeError), NumPy scalars and
bools. Every constructor and method argument that is a number goes through `number` or `integer`, so none of
them can raise a raw OverflowError or TypeError, and every refusal names the argument and the value.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable

import numpy as np

from ._errors import ConfigError

__all__ = ["integer", "number", "shown"]


def shown(value: object) -> str:
    """`value` for a message: its repr, but an int of more than 30 digits by its size ("an integer of 401 digits
    (about 10**400)"), and a repr Python cannot or should not print in full by reprlib's abbreviation."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        v = int(value)
        if abs(v) >= 10**30:
            e = int(math.log10(abs(v)))  # exact enough for the message; math.log10 takes ints of any size
            return f"an integer of about {e + 1} digits ({'-' if v < 0 else ''}10**{e})"
    try:
        text = repr(value)
        return text if len(text) <= 80 else reprlib.repr(value)
    except Exception:  # e.g. a Fraction of ints beyond Python's int-to-str digit limit
        return f"a {type(value).__name__}"


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def number(name: str, value: object, rule: str, ok: Callable[[float], bool] = lambda v: True) -> float:
    """`value` as a finite float satisfying `ok`, else a ConfigError "{name} must be {rule}, got {value}".

    Bools and strings are refused (so `lr=True` or `lr="0.1"` cannot pass as a number); ints, Fractions and
    NumPy scalars are taken at their value, and one a float cannot hold (`10**400`) is refused.
    """
    if not _real(value):
        raise ConfigError(f"{name} must be {rule}, got {shown(value)}")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (OverflowError, ValueError, TypeError, ZeroDivisionError):
        raise ConfigError(f"{name} must be {rule}, got {shown(value)}, beyond the range of a float") from None
    if not (math.isfinite(v) and ok(v)):
        raise ConfigError(f"{name} must be {rule}, got {shown(value)}")
    return v


def integer(name: str, value: object, lo: int, hi: int | None = None, integral_floats: bool = False) -> int:
    """`value` as an int in [lo, hi) (or >= lo), else a ConfigError naming `name` and the value.

    Bools and strings are refused, and floats unless `integral_floats` (then 3.0 and Fraction(6, 2) pass and
    2.9 does not); ints of any size are compared exactly, never through a float.
    """
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
    ok = _real(value)
    if ok and not isinstance(value, numbers.Integral):
        try:
            ok = integral_floats and math.isfinite(float(value)) and value == math.floor(value)  # type: ignore
        except (OverflowError, ValueError, TypeError, ZeroDivisionError):
            ok = False
    if not ok or value < lo or (hi is not None and value >= hi):  # type: ignore[operator]
        raise ConfigError(f"{name} must be an integer {bound}, got {shown(value)}")
    return int(value)  # type: ignore[call-overload]
