"""The benchmark's graphs from bench.json: µs/step vs hidden width and vs batch, training loss vs step, end-to-end
time, µs per model-step vs the number of models K, test accuracy vs time (time to accuracy).

python benchmarks/plots.py results/   # reads results/raw/bench.json; writes the *_graph.png beside it
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only; no display on the GPU machine
import matplotlib.pyplot as plt  # noqa: E402
from report import RAW_DIR  # noqa: E402
from workloads import LOSS_WORKLOADS, MLP_BATCH  # noqa: E402

__all__ = ["batch_graph", "e2e_graph", "loss_graph", "many_graph", "time_graph", "tta_graph", "write_graphs"]

#: The PyTorch AMP row drawn against fastnn-mixed, first present wins.
TORCH_AMP = ("torch-eager-amp", "torch-graph-amp", "torch-compile-amp")


def _ok(r: dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("train_seconds") is not None


def _us(r: dict[str, Any]) -> float:
    """Microseconds per step of a training row."""
    return 1e6 * (r.get("seconds_per_step") or r["train_seconds"] / r["steps"])


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _lines(ax: Any, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, title: str) -> None:
    """One line a contender (fastnn's solid, the others dashed) on log2 x by log y axes, each x value a tick."""
    for name, pts in series.items():
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if name.startswith("fastnn") else "--", marker="o",
                label=name)  # fmt: skip
    xs = sorted({p[0] for pts in series.values() for p in pts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def batch_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """Microseconds per step vs batch size, one panel per hidden width of the batch grid, one line per contender."""
    from workloads import GRID_HIDDEN

    rows = [r for r in doc["rows"] if _ok(r) and r.get("hidden") in GRID_HIDDEN]
    widths = [h for h in GRID_HIDDEN if len({doc["workloads"][r["workload"]]["batch_size"] for r in rows
                                             if r["hidden"] == h}) > 1]  # fmt: skip
    if not widths:
        return None
    fig, axes = plt.subplots(1, len(widths), figsize=(6 * len(widths), 5), squeeze=False)
    for ax, h in zip(axes[0], widths):
        mine = [r for r in rows if r["hidden"] == h]
        series: dict[str, list[tuple[float, float]]] = {}
        for r in mine:
            series.setdefault(r["contender"], []).append((doc["workloads"][r["workload"]]["batch_size"], _us(r)))
        _lines(ax, series, "batch size", "µs per training step",
               f"MLP 784-{h}-{h}-{h}-10, {doc['environment'].get('device')}")  # fmt: skip
    return _save(fig, path)


def many_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """Microseconds per model and step vs the number of models K, one panel per workload, log-log."""
    rows = doc.get("many_rows", [])
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 5), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == w]
        series: dict[str, list[tuple[float, float]]] = {}
        for r in mine:
            series.setdefault(r["contender"], []).append((r["models"], r["per_model_step_us"]))
        _lines(ax, series, "models trained at once (K)", "µs per model and step (one epoch, wall clock)",
               f"{w}, {doc['environment'].get('device')}")  # fmt: skip
    return _save(fig, path)


def tta_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """Test accuracy vs seconds since the process started (set-up included), one panel per time-to-accuracy
    workload, one line per contender, the target dashed."""
    rows = [r for r in doc.get("tta_rows", []) if r.get("status") == "ok" and r.get("epochs")]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 5), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == w]
        for r in mine:
            xs = [e["evaluated_at"] for e in r["epochs"]]
            ax.plot(xs, [e["test_accuracy"] for e in r["epochs"]], "-" if r["contender"].startswith("fastnn")
                    else "--", marker="o", ms=3, label=r["contender"])  # fmt: skip
        ax.axhline(mine[0]["target_accuracy"], color="gray", ls=":", label=f"target {mine[0]['target_accuracy']}")
        ax.set_xscale("log")
        ax.set_xlabel("seconds since the process started (set-up included)")
        ax.set_ylabel("test accuracy after each epoch")
        ax.set_title(f"{w}, {doc['environment'].get('device')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def time_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """Microseconds per step vs hidden width (the batch-32 MLPs), one line per contender, log-log."""
    rows = [r for r in doc["rows"] if _ok(r) and r.get("hidden")
            and doc["workloads"][r["workload"]]["batch_size"] == MLP_BATCH]  # fmt: skip
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 5.5))
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(r["contender"], []).append((r["hidden"], _us(r)))
    w = next(doc["workloads"][r["workload"]] for r in rows)
    _lines(ax, series, "hidden width h (MLP 784-h-h-h-10)", "µs per training step (timed epochs only)",
           f"{w['steps']} SGD steps of batch {w['batch_size']}, {doc['environment'].get('device')}")  # fmt: skip
    return _save(fig, path)


def loss_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """Train loss vs step: fastnn-mixed's per-epoch mean (History) against PyTorch AMP's per-step loss and means.

    fastnn does not expose per-step losses, so its points are each epoch's mean over its samples, drawn at the
    epoch's last step; the torch line is every step's batch loss, with its epoch means drawn the same way.
    """
    cell = {(r["workload"], r["contender"]): r for r in doc["rows"] if _ok(r)}
    panels = []
    for w in LOSS_WORKLOADS:
        torch_row = next((cell[(w, c)] for c in TORCH_AMP if (w, c) in cell), None)
        if (w, "fastnn-mixed") in cell or torch_row is not None:
            panels.append((w, cell.get((w, "fastnn-mixed")), torch_row))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False)
    for ax, (w, fast, tr) in zip(axes[0], panels):
        spe = doc["workloads"][w]["steps_per_epoch"]
        if tr is not None and tr.get("step_losses"):
            steps = range(1, len(tr["step_losses"]) + 1)
            ax.plot(
                steps, tr["step_losses"], color="tab:orange", alpha=0.25, lw=0.6, label=f"{tr['contender']}: per step"
            )
        # torch's means as large open circles under fastnn's dots, so both show where they coincide
        styles = ((tr, "tab:orange", "epoch mean", {"ms": 11, "mfc": "none", "mew": 2}),
                  (fast, "tab:blue", "epoch mean (History)", {"ms": 5}))  # fmt: skip
        for row, color, label, marker in styles:
            if row is None:
                continue
            ends = [spe * (e + 1) for e in range(len(row["epoch_losses"]))]
            ax.plot(ends, row["epoch_losses"], "o-", color=color, label=f"{row['contender']}: {label}", **marker)
        ax.set_yscale("log")
        ax.set_xlabel("step of the timed run (epoch means drawn at the epoch's last step)")
        ax.set_ylabel("training loss (softmax cross-entropy)")
        ax.set_title(f"{w}: {'-'.join(str(s) for s in doc['workloads'][w]['sizes'])}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def e2e_graph(doc: dict[str, Any], path: Path) -> Path | None:
    """End-to-end time per contender per workload (grouped bars, log scale): cold filled, warm hatched."""
    rows = [r for r in doc.get("e2e_rows", []) if r.get("status") == "ok" and r.get("e2e_seconds")]
    if not rows:
        return None
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    names = list(dict.fromkeys(r["contender"] for r in rows))
    modes = [m for m in ("cold", "warm") if any(r["mode"] == m for r in rows)]
    cell = {(r["workload"], r["contender"], r["mode"]): r["e2e_seconds"] for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(workloads) * len(modes)), 5.5))
    width = 0.8 / len(names)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = [(w, m) for w in workloads for m in modes]
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ys = [cell.get((w, name, m), 0.0) for w, m in groups]
        hatch = ["" if m == "cold" else "//" for _, m in groups]
        bars = ax.bar(xs, ys, width, label=name, color=colors[i % len(colors)])
        for bar, h in zip(bars, hatch):
            bar.set_hatch(h)
    ax.set_xticks(range(len(groups)), [f"{w}\n{m}" for w, m in groups])
    ax.set_yscale("log")
    ax.set_ylabel("seconds from a fresh process to trained weights")
    ax.set_title(f"End to end: import, data to the GPU, compile/capture, training ({doc['environment'].get('device')})")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_graphs(doc: dict[str, Any], out: Path) -> list[Path]:
    """The graphs into `out`; a graph without data is skipped. Returns the paths written."""
    done = [time_graph(doc, out / "time_graph.png"), loss_graph(doc, out / "loss_graph.png"),
            e2e_graph(doc, out / "e2e_graph.png"), batch_graph(doc, out / "batch_graph.png"),
            many_graph(doc, out / "many_graph.png"), tta_graph(doc, out / "tta_graph.png")]  # fmt: skip
    return [p for p in done if p is not None]


def main(argv: list[str] | None = None) -> int:
    out = Path((argv if argv is not None else sys.argv[1:] or ["results"])[0])
    doc = json.loads((out / RAW_DIR / "bench.json").read_text())  # raw: the loss graph draws every step
    for p in write_graphs(doc, out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
