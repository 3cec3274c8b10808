"""`History`: the per-epoch numbers of training, as records (`history[-1]`) or columns (`history["train_loss"]`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["FIELDS", "History"]

#: The fields of every record, in table order; eval fields are None for epochs not evaluated.
FIELDS = ("epoch", "train_loss", "train_accuracy", "eval_loss", "eval_accuracy", "seconds")


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
        return isinstance(other, History) and self._records == other._records

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
            raise ImportError("History.plot needs matplotlib: pip install matplotlib (or fastnn[bench])") from exc
        ax_loss, ax_acc = fig.subplots(1, 2)
        epochs = self["epoch"]
        for ax, field in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            ax.plot(epochs, self[f"train_{field}"], marker="o", label="train")
            evaluated = [(e, v) for e, v in zip(epochs, self[f"eval_{field}"]) if v is not None]
            if evaluated:
                ax.plot(*zip(*evaluated), marker="o", label="eval")
            ax.set_xlabel("epoch")
            ax.set_ylabel(field)
            ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
        return fig


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
