"""What `fit(progress=...)` shows: one line per finished epoch, and with tqdm on the CPU a bar moving within it.

Epochs are shown numbered from 1, as `History` records them ("epoch 3/10" is the third epoch the trainer
ever trained; the 10 is the number the fit call ends at). On the GPU an epoch takes milliseconds and runs
as one graph, so it gets one line when it finishes; the CPU engine reports every step, so with tqdm
installed a bar moves while the epoch trains (on a terminal) and gives way to the epoch's line. Without
tqdm both print the lines alone.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, TextIO

import numpy as np

from ._errors import ConfigError

__all__ = ["PROGRESS", "EpochReporter", "check_progress", "format_epoch", "print_epoch", "reporter"]

PROGRESS = (False, True, "auto")


def check_progress(progress: Any, stream: TextIO | None = None) -> bool:
    """Whether to show progress: True, False, or "auto" (on when `stream`, default stdout, is a terminal)."""
    if progress == "auto" and isinstance(progress, str):
        out = stream or sys.stdout
        try:
            return bool(out.isatty())
        except (AttributeError, ValueError):  # a replaced or closed stdout
            return False
    if isinstance(progress, (bool, np.bool_)):
        return bool(progress)
    raise ConfigError(f"progress must be True, False or 'auto', got {progress!r}")


def _numbers(record: dict[str, Any]) -> str:
    """Loss and accuracy, train then eval; a regression's records have no accuracy (None)."""
    line = f"loss {record['train_loss']:.4f}"
    if record["train_accuracy"] is not None:
        line += f"  acc {record['train_accuracy']:.4f}"
    if record["eval_loss"] is not None:
        line += f"  eval loss {record['eval_loss']:.4f}"
    if record["eval_accuracy"] is not None:
        line += f"  eval acc {record['eval_accuracy']:.4f}"
    return line


def format_epoch(record: dict[str, Any], last: int) -> str:
    """A history record as one line: "epoch n/last", train loss and accuracy, eval numbers if any, seconds."""
    return f"epoch {record['epoch']:>{len(str(last))}}/{last}  {_numbers(record)}  {record['seconds']:.2f}s"


def print_epoch(record: dict[str, Any], last: int, stream: TextIO | None = None) -> None:
    """Print `format_epoch` and flush, so the line shows while the next epoch trains."""
    print(format_epoch(record, last), file=stream or sys.stdout, flush=True)


class EpochReporter:
    """Plain lines: `epoch(record)` prints one per finished epoch; `step()` does nothing."""

    per_step = False

    def __init__(self, last: int, steps: int, stream: TextIO | None = None) -> None:
        self.last, self.steps, self.stream = last, steps, stream

    def step(self) -> None:
        """One training step finished (called by the CPU engine only)."""

    def epoch(self, record: dict[str, Any]) -> None:
        print_epoch(record, self.last, self.stream)

    def note(self, text: str) -> None:
        """One line that is not an epoch's (how early stopping ended)."""
        print(text, file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        """Leave the display tidy (called once when fit ends, however it ends)."""


class _TqdmLines(EpochReporter):
    """GPU epochs: one line each through tqdm.write (so it interleaves with any other bar on screen), flushed
    (tqdm.write does not) so that the line shows while the next epoch trains, in a pipe too."""

    def epoch(self, record: dict[str, Any]) -> None:
        self.note(format_epoch(record, self.last))

    def note(self, text: str) -> None:
        from tqdm import tqdm

        out = self.stream or sys.stdout
        tqdm.write(text, file=out)
        out.flush()


class _TqdmBar(_TqdmLines):
    """CPU epochs: a bar that moves with every step while the epoch trains (only on a terminal: tqdm's
    disable=None), replaced by the epoch's line when it ends, so what stays on screen is the same lines."""

    per_step = True

    def __init__(self, last: int, steps: int, stream: TextIO | None = None) -> None:
        super().__init__(last, steps, stream)
        self._bar: Any = None
        self.number = 1  #: the epoch the next bar shows (1-based)

    def step(self) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.steps,
                desc=f"epoch {self.number:>{len(str(self.last))}}/{self.last}",
                unit="step",
                leave=False,
                disable=None,  # no bar where the stream is not a terminal: a log gets the lines only
                file=self.stream or sys.stdout,
                dynamic_ncols=True,
            )
        self._bar.update(1)

    def epoch(self, record: dict[str, Any]) -> None:
        self.close()
        self.number = record["epoch"] + 1
        super().epoch(record)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _have_tqdm() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


class _Guarded:
    """An EpochReporter whose stream failing (a broken pipe after `| head -1`, a closed sys.stdout, any OSError
    or ValueError from a write) turns the display off with one warning: a display never stops the training."""

    def __init__(self, inner: EpochReporter) -> None:
        self._inner, self.per_step, self.failed = inner, inner.per_step, False

    def _call(self, method: str, *args: Any) -> None:
        if self.failed:
            return
        try:
            getattr(self._inner, method)(*args)
        except (OSError, ValueError) as exc:
            self.failed = True
            warnings.warn(
                f"fastnn: progress display turned off, training goes on: writing it failed ({exc!r})",
                RuntimeWarning,
                stacklevel=3,
            )

    def step(self) -> None:
        self._call("step")

    def epoch(self, record: dict[str, Any]) -> None:
        self._call("epoch", record)

    def note(self, text: str) -> None:
        self._call("note", text)

    def close(self) -> None:
        self._call("close")


def reporter(first: int, last: int, steps: int, per_step: bool, stream: TextIO | None = None) -> EpochReporter:
    """The display for epochs `first`..`last` (1-based) of `steps` steps; a moving bar when `per_step` and tqdm.

    A failing stream turns it off with one RuntimeWarning; it never raises from a write.
    """
    if not _have_tqdm():
        shown: EpochReporter = EpochReporter(last, steps, stream)
    elif not per_step:
        shown = _TqdmLines(last, steps, stream)
    else:
        shown = _TqdmBar(last, steps, stream)
        shown.number = first
    return _Guarded(shown)  # type: ignore[return-value]
