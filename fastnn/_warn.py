"""One way for fastnn to warn: at the user's line, the first frame outside fastnn and scikit-learn.

A fixed `stacklevel` names the right line from one call path only: the CPU-fallback warning raised inside
`fastnn.sklearn`'s `fit` pointed at fastnn/sklearn/_base.py. Walking the stack past fastnn's own files (and
scikit-learn's, which calls the estimators from pipelines and searches) names the user's line from every path.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["caller_stacklevel", "warn_at_caller"]

_FASTNN = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _skipped_prefixes() -> tuple[str, ...]:
    prefixes = [_FASTNN]
    sklearn = sys.modules.get("sklearn")
    if sklearn is not None and getattr(sklearn, "__file__", None):
        prefixes.append(os.path.dirname(os.path.abspath(sklearn.__file__)) + os.sep)
    return tuple(prefixes)


def caller_stacklevel(depth: int = 1) -> int:
    """The `stacklevel` that a warnings.warn call in the function `depth` frames up (1: this one's caller) gives
    to name the first frame outside fastnn and scikit-learn."""
    skipped = _skipped_prefixes()
    frame, level = sys._getframe(depth), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """warnings.warn(message, category) attributed to the user's line."""
    warnings.warn(message, category, stacklevel=caller_stacklevel())
