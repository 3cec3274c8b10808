"""One plain line per finished epoch for `fit(progress=True)`; silent when progress is off."""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["format_epoch", "print_epoch"]


def format_epoch(record: dict[str, Any], last_epoch: int) -> str:
    """A history record as one line: epoch i/n, train loss and accuracy, eval numbers if any, seconds."""
    width = len(str(last_epoch + 1))
    line = (
        f"epoch {record['epoch'] + 1:>{width}}/{last_epoch + 1}"
        f"  loss {record['train_loss']:.4f}  acc {record['train_accuracy']:.4f}"
    )
    if record["eval_loss"] is not None:
        line += f"  eval loss {record['eval_loss']:.4f}  eval acc {record['eval_accuracy']:.4f}"
    return line + f"  {record['seconds']:.2f}s"


def print_epoch(record: dict[str, Any], last_epoch: int, stream: TextIO | None = None) -> None:
    """Print `format_epoch` and flush, so the line shows while the next epoch trains."""
    print(format_epoch(record, last_epoch), file=stream or sys.stdout, flush=True)
