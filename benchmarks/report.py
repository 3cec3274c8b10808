"""Partial results -> bench.json and bench.md: merge runs, compute fastnn's speedups, write the markdown tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads import CONTENDERS, write_json

__all__ = ["PARTIAL_DIR", "add_speedups", "load_partials", "markdown", "merge", "write_outputs"]

PARTIAL_DIR = "partial"
SCHEMA = 1
#: The fastnn row each contender's time is compared with "at matched precision".
MATCHED = {"fp32": "fastnn-fp32", "amp": "fastnn-mixed", "mixed": "fastnn-mixed", "fp16": "fastnn-fp16"}
_ORDER = {c.name: i for i, c in enumerate(CONTENDERS)}


def _merged_environment(envs: list[dict[str, Any]]) -> dict[str, Any]:
    """Later runs' values win; keys a later run lacks (or left empty) keep an earlier run's value."""
    out: dict[str, Any] = {}
    for env in envs:
        out.update({k: v for k, v in env.items() if v not in (None, "", "n/a")})
    return out


def load_partials(out: Path) -> list[dict[str, Any]]:
    """Every partial result file under out/partial, oldest run first."""
    docs = [json.loads(p.read_text()) for p in sorted((out / PARTIAL_DIR).glob("*.json"))]
    return sorted(docs, key=lambda d: d["run"]["started"])


def _ok(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok" and row.get("train_seconds") is not None


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """fastnn's speedup over each row (row time / fastnn time, same workload): vs fastnn-mixed and matched precision."""
    by_key = {(r["workload"], r["contender"]): r for r in rows if _ok(r)}
    for r in rows:
        for field, ref_name in (("fastnn_mixed", "fastnn-mixed"), ("fastnn_matched", MATCHED.get(r["precision"]))):
            ref = by_key.get((r["workload"], ref_name))
            if ref is None or not _ok(r) or ref["train_seconds"] <= 0:
                r[f"speedup_{field}"] = None
                continue
            r[f"speedup_{field}"] = r["train_seconds"] / ref["train_seconds"]
            r[f"speedup_{field}_ref"] = ref_name
            r[f"speedup_{field}_same_run"] = ref["run_id"] == r["run_id"]


def merge(partials: list[dict[str, Any]]) -> dict[str, Any]:
    """One bench document from partial runs; a later run's row replaces an earlier one for the same pair."""
    if not partials:
        raise SystemExit("no partial results to merge (run bench_mnist.py first)")
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    workloads: dict[str, Any] = {}
    for doc in partials:
        for name, plan in doc["workloads"].items():
            if workloads.get(name, plan) != plan:
                raise SystemExit(
                    f"run {doc['run']['run_id']} ran workload {name!r} differently from an earlier run "
                    f"({plan} vs {workloads[name]}): --quick and full runs need separate --out folders"
                )
            workloads[name] = plan
        for row in doc["rows"]:
            rows[(row["workload"], row["contender"])] = row
    names = list(workloads)
    merged = sorted(rows.values(), key=lambda r: (names.index(r["workload"]), _ORDER.get(r["contender"], 99)))
    add_speedups(merged)
    return {
        "schema": SCHEMA,
        # the latest run's facts, completed by earlier runs' (a fastnn-only run records no torch version)
        "environment": _merged_environment([d["environment"] for d in partials]),
        "runs": [d["run"] | {"environment": d["environment"]} for d in partials],
        "workloads": workloads,
        "rows": merged,
    }


def _f(v: Any, fmt: str, scale: float = 1.0) -> str:
    return "–" if v is None else format(v * scale, fmt)


def _describe(w: dict[str, Any]) -> str:
    sizes = "-".join(str(s) for s in w["sizes"])
    return (
        f"{sizes}, SGD lr {w['lr']}, batch {w['batch_size']}, {w['epochs']} epochs x {w['steps_per_epoch']} steps "
        f"= {w['steps']} steps over the first {w['samples']:,} training samples"
    )


def markdown(doc: dict[str, Any]) -> str:
    """bench.md: environment, the time and speedup tables across workloads, and one detail table per workload."""
    env = doc["environment"]
    rows = doc["rows"]
    wl = {w: spec for w, spec in doc["workloads"].items() if any(r["workload"] == w for r in rows)}
    contenders = sorted({r["contender"] for r in rows}, key=lambda c: _ORDER.get(c, 99))
    cell = {(r["workload"], r["contender"]): r for r in rows}
    lines = [
        "# fastnn vs PyTorch on Fashion-MNIST",
        "",
        f"Device: {env.get('device')} (driver {env.get('driver_version')}); fastnn {env.get('fastnn')}, "
        f"cuBLASLt {env.get('cublaslt')}, cuDNN {env.get('cudnn')}, NVRTC {env.get('nvrtc')}; "
        f"PyTorch {env.get('torch', 'n/a')} (CUDA {env.get('torch_cuda', 'n/a')}); {env.get('date')}.",
        "",
        "Every contender starts from the same weights, reads the samples in the same order and takes the same "
        "SGD steps. Times cover the timed epochs only: compilation, capture and a warm-up are in 'setup'. "
        "fastnn: `fit()` wall clock with a device sync; PyTorch: CUDA events; NumPy: wall clock"
        + (", scaled from fewer epochs where marked *." if any(r.get("scaled") for r in rows) else "."),
        "",
        "## Training time (s)",
        "",
        "| contender | " + " | ".join(wl) + " |",
        "|---|" + "---:|" * len(wl),
    ]
    for c in contenders:
        vals = []
        for w in wl:
            r = cell.get((w, c))
            v = "" if r is None else ("failed" if not _ok(r) else _f(r["train_seconds"], ".3g"))
            vals.append(v + ("*" if r is not None and r.get("scaled") else ""))
        lines.append(f"| {c} | " + " | ".join(vals) + " |")
    lines += [
        "",
        "## Speedup of fastnn-mixed (contender time / fastnn-mixed time)",
        "",
        "| contender | " + " | ".join(wl) + " |",
        "|---|" + "---:|" * len(wl),
    ]
    for c in contenders:
        if c == "fastnn-mixed":
            continue
        vals = []
        for w in wl:
            r = cell.get((w, c))
            s = None if r is None else r.get("speedup_fastnn_mixed")
            vals.append("" if s is None else f"{s:.2f}x")
        lines.append(f"| {c} | " + " | ".join(vals) + " |")
    for w, spec in wl.items():
        lines += [
            "",
            f"### {w}: {_describe(spec)}",
            "",
            "| contender | time s | ms/step | s/epoch | setup s | final train loss | test acc | peak MiB "
            "| fastnn-mixed speedup | matched speedup | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for c in contenders:
            r = cell.get((w, c))
            if r is None:
                continue
            if not _ok(r):
                lines.append(f"| {c} | failed |  |  |  |  |  |  |  |  | {r.get('error', '')[:100]} |")
                continue
            matched = r.get("speedup_fastnn_matched")
            matched_s = "" if matched is None else f"{matched:.2f} ({r.get('speedup_fastnn_matched_ref')})"
            lines.append(
                f"| {c} | {_f(r['train_seconds'], '.3f')}{'*' if r.get('scaled') else ''} "
                f"| {_f(r.get('seconds_per_step'), '.4f', 1e3)} | {_f(r.get('seconds_per_epoch'), '.3f')} "
                f"| {_f(r.get('setup_seconds'), '.2f')} | {_f(r.get('final_train_loss'), '.4f')} "
                f"| {_f(r.get('test_accuracy'), '.4f')} | {_f(r.get('peak_memory_bytes'), '.0f', 2**-20)} "
                f"| {_f(r.get('speedup_fastnn_mixed'), '.2f')} "
                f"| {matched_s} "
                f"| {r.get('note', '')} |"
            )
    lines += ["", "Contenders:", ""]
    lines += [f"- `{c.name}`: {c.description}" for c in CONTENDERS if c.name in contenders]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, plots: bool = True) -> dict[str, Any]:
    """Merge out/partial/*.json into out/bench.json and out/bench.md (and the two graphs when asked)."""
    doc = merge(load_partials(out))
    write_json(out / "bench.json", doc)
    (out / "bench.md").write_text(markdown(doc))
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'} ({len(doc['rows'])} rows)")
    if plots:
        try:
            import plots as plotting
        except ImportError as e:
            print(f"no graphs: {e}")
        else:
            for path in plotting.write_graphs(doc, out):
                print(f"wrote {path}")
    return doc
