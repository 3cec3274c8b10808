"""`History`: the per-epoch numbers of training, as records (`history[-1]`) or columns (`history["train_loss"]`).

Epochs are numbered from 1, as progress lines and `TrainingDiverged` number them: record["epoch"] == n is the
trainer's n-th epoch, after which `trainer.epoch` == n. The table and the plot's x-axis show these numbers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["FIELDS", "SAVED_RECORDS", "History", "check_records", "encode_records"]

#: The fields of every record, in table order; eval fields are None for epochs not evaluated; epoch counts from 1.
FIELDS = ("epoch", "train_loss", "train_accuracy", "eval_loss", "eval_accuracy", "seconds")
#: Records a checkpoint keeps: the last this many epochs (`trainer.history` in memory keeps every one). At most
#: ~215 characters of JSON a record, stored as UTF-32: ~86 MB, within the 128 MiB a checkpoint's config may take.
SAVED_RECORDS = 100_000


class History:
    """Per-epoch records of one `fit` call (what fit returns) or of a trainer's whole life (`trainer.history`)."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        self._records: list[dict[str, Any]] = []
        for r in records:
            self.append(r)

    def append(self, record: dict[str, Any]) -> None:
        """Add one epoch's record; it must hold exactly FIELDS."""
        if set(record) != set(FIELDS):
            raise ValueError(f"a history record holds the fields {FIELDS}, got {sorted(record)}")
        self._records.append({f: record[f] for f in FIELDS})

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (dict(r) for r in self._records)

    def __getitem__(self, key: int | slice | str) -> Any:
        """An int gives one record (a dict copy), a slice a History, a field name that column as a list."""
        if isinstance(key, str):
            if key not in FIELDS:
                raise KeyError(f"{key!r} is not a history field; fields are {FIELDS}")
            return [r[key] for r in self._records]
        if isinstance(key, slice):
            return History(self._records[key])
        return dict(self._records[key])

    def __eq__(self, other: object) -> bool:
        """The same records, NaN matching NaN (an evaluation's NaN loss is a value like any other)."""
        return (
            isinstance(other, History)
            and len(self) == len(other)
            and all(_same(a[f], b[f]) for a, b in zip(self._records, other._records) for f in FIELDS)
        )

    def to_dict(self) -> dict[str, list[Any]]:
        """Columns: each field's values in epoch order (JSON-serialisable)."""
        return {f: [r[f] for r in self._records] for f in FIELDS}

    def __repr__(self) -> str:
        return f"History({len(self)} epochs)"

    def __str__(self) -> str:
        head = ("epoch", "train loss", "train acc", "eval loss", "eval acc", "seconds")
        rows = [
            (
                str(r["epoch"]),
                _num(r["train_loss"]),
                _num(r["train_accuracy"]),
                _num(r["eval_loss"]),
                _num(r["eval_accuracy"]),
                f"{r['seconds']:.2f}",
            )
            for r in self._records
        ]
        widths = [max(len(c) for c in col) for col in zip(head, *rows)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [head, *rows]]
        return "\n".join(lines)

    def plot(self, path: str | None = None) -> Any:
        """Loss and accuracy curves with matplotlib; saved to `path` when given. Returns the Figure.

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            if path is None:
                import matplotlib.pyplot as plt

                fig = plt.figure(figsize=(10, 4))
            else:
                from matplotlib.figure import Figure  # no pyplot: writing a file needs no display or backend

                fig = Figure(figsize=(10, 4))
        except ImportError as exc:
            from ._install import pip_install

            hint = f"{pip_install('plot')}, or pip install matplotlib"
            raise ImportError(f"History.plot needs matplotlib: {hint}") from exc
        ax_loss, ax_acc = fig.subplots(1, 2)
        epochs = self["epoch"]
        for ax, field in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            for which in ("train", "eval"):  # None: not evaluated, or a regression (no accuracy)
                points = [(e, v) for e, v in zip(epochs, self[f"{which}_{field}"]) if v is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", label=which)
            ax.set_xlabel("epoch")
            ax.set_ylabel(field)
            if ax.lines:
                ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
        return fig


#: How a non-finite evaluation value is written in a checkpoint's JSON, which has no NaN or infinity.
_ENCODED = {"nan": math.nan, "inf": math.inf}


def encode_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records as strict JSON holds them: a NaN or infinite evaluation value as the string "nan" or "inf".

    Evaluation results are reports, not training state: an eval set the model cannot score (a NaN loss) is
    recorded as it is, and must not stop the trainer from being saved. `check_records` decodes them.
    """
    out = []
    for r in records:
        r = dict(r)
        for field in ("eval_loss", "eval_accuracy"):
            value = r[field]
            if isinstance(value, float) and (math.isnan(value) or value == math.inf):
                r[field] = "nan" if math.isnan(value) else "inf"
        out.append(r)
    return out


def check_records(records: Any, first: int = 1) -> list[dict[str, Any]]:
    """The records of a history fastnn could have written, as `encode_records` wrote them, decoded; else
    ValueError naming the record and field.

    Each record holds exactly FIELDS: epoch an integer in [first, 2**32 + first) (first = 1, so [1, 2**32];
    checkpoints written before epochs were numbered from 1 hold first = 0), train_loss finite and >= 0,
    train_accuracy in [0, 1], seconds finite and >= 0; eval_loss and eval_accuracy are both None (epoch not
    evaluated) or both given: eval_loss a number >= 0 or "nan" or "inf", eval_accuracy a number in [0, 1] or
    "nan"; a regression's records (loss "mse") hold None for both accuracies. `Trainer.save` and `Trainer.load`
    apply this same check.
    """
    if not isinstance(records, list):
        raise ValueError(f"history must be a list of records, got {type(records).__name__}")
    decoded = []
    for i, r in enumerate(records):
        if not isinstance(r, dict) or set(r) != set(FIELDS):
            raise ValueError(f"history[{i}] must be a record of the fields {FIELDS}, got {r!r}")
        for field, value in r.items():
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if field == "epoch":
                ok = isinstance(value, int) and number and first <= value < 2**32 + first
                rule = "an integer in [1, 2**32]" if first else "an integer in [0, 2**32)"
            elif field.endswith("accuracy"):
                ok, rule = number and 0.0 <= value <= 1.0, "a number in [0, 1]"
            else:  # losses and seconds
                ok, rule = number and math.isfinite(value) and value >= 0, "a finite number >= 0"
            if field.startswith("eval_"):
                codes = ("nan", "inf") if field == "eval_loss" else ("nan",)
                ok = ok or value is None or (isinstance(value, str) and value in codes)
                rule = f"None, {rule} or one of {codes}"
            elif field == "train_accuracy":
                ok, rule = ok or value is None, f"None or {rule}"
            if not ok:
                raise ValueError(f"history[{i}][{field!r}] must be {rule}, got {value!r}")
        if r["train_accuracy"] is None:  # a regression's epoch: no accuracy, evaluated or not
            if r["eval_accuracy"] is not None:
                raise ValueError(f"history[{i}] has an eval_accuracy but no train_accuracy: {r!r}")
        elif (r["eval_loss"] is None) != (r["eval_accuracy"] is None):
            raise ValueError(f"history[{i}] has only one of eval_loss and eval_accuracy: {r!r}")
        decoded.append({f: _ENCODED[v] if isinstance(v, str) else v for f, v in r.items()})
    return decoded


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
