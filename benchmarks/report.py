"""Partial results -> bench.json, bench.md and bench_summary.json: merge runs, compute fastnn's speedups, write the
markdown tables and the compact JSON kept in git.

    python benchmarks/report.py results/   # bench.md and bench_summary.json again from results/raw/bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from workloads import CONTENDERS, write_json, write_text

__all__ = ["PARTIAL_DIR", "RAW_DIR", "add_speedups", "load_partials", "markdown", "merge", "summary", "write_outputs"]

#: Raw outputs live under OUT/raw/, which git ignores (.gitignore): each run's partial file, the merged bench.json
#: (1.5 MB for the published run, most of it per-step losses) and the logs. OUT itself keeps the summaries
#: (bench.md, bench_summary.json, the graphs), which are what gets committed.
RAW_DIR = "raw"
PARTIAL_DIR = f"{RAW_DIR}/partial"
SUMMARY = "bench_summary.json"
#: Per-step and per-epoch series and repeated prose: in the raw bench.json only. bench.md needs none of them.
RAW_ONLY = frozenset({"step_losses", "epoch_seconds", "warmup_epoch_seconds", "timing", "memory_note", "description"})
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
    """Every partial result file under out/raw/partial, oldest run first."""
    docs = [json.loads(p.read_text()) for p in sorted((out / PARTIAL_DIR).glob("*.json"))]
    return sorted(docs, key=lambda d: d["run"]["started"])


def _ok(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok" and row.get("train_seconds") is not None


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """fastnn's speedup over each row (row time / fastnn time, same workload): vs fastnn-mixed and matched precision.

    The fastnn row of the same run (device call) is preferred, a drift repeat included; else the published one.
    """
    by_key = {(r["workload"], r["contender"]): r for r in rows if _ok(r)}
    by_run = {
        (x["workload"], x["contender"], x["run_id"]): x for r in rows for x in [r, *r.get("repeats", [])] if _ok(x)
    }
    for r in rows:
        for field, ref_name in (("fastnn_mixed", "fastnn-mixed"), ("fastnn_matched", MATCHED.get(r["precision"]))):
            ref = by_run.get((r["workload"], ref_name, r.get("run_id"))) or by_key.get((r["workload"], ref_name))
            if ref is None or not _ok(r) or ref["train_seconds"] <= 0:
                r[f"speedup_{field}"] = None
                continue
            r[f"speedup_{field}"] = r["train_seconds"] / ref["train_seconds"]
            r[f"speedup_{field}_ref"] = ref_name
            r[f"speedup_{field}_same_run"] = ref["run_id"] == r["run_id"]


#: The end-to-end and time-to-accuracy rows are compared with fastnn's default (engine "auto", mixed precision).
E2E_REF = "fastnn-mixed"


def _e2e_ok(r: dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("e2e_seconds") is not None


def add_e2e_speedups(rows: list[dict[str, Any]]) -> None:
    """Per (workload, mode): row time / fastnn-mixed's time, end to end and training only (the same run only)."""
    ref = {(r["workload"], r.get("mode"), r.get("run_id")): r for r in rows if r["contender"] == E2E_REF and _e2e_ok(r)}
    for r in rows:
        f = ref.get((r["workload"], r.get("mode"), r.get("run_id")))
        ok = f is not None and _e2e_ok(r)
        r["speedup_e2e"] = r["e2e_seconds"] / f["e2e_seconds"] if ok else None
        tr = ok and r.get("train_seconds") and f.get("train_seconds")
        r["speedup_train"] = r["train_seconds"] / f["train_seconds"] if tr else None


def merge(partials: list[dict[str, Any]]) -> dict[str, Any]:
    """One bench document from partial runs; a later run's row replaces an earlier one for the same pair."""
    if not partials:
        raise SystemExit("no partial results to merge (run bench_mnist.py first)")
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    extra: dict[str, dict[tuple, dict[str, Any]]] = {"e2e_rows": {}, "tta_rows": {}}
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
            key = (row["workload"], row["contender"])
            if row.get("repeat") and key in rows:  # a drift repeat: beside the earlier row, not replacing it
                rows[key].setdefault("repeats", []).append(row)
            else:
                rows[key] = row
        for table in ("e2e_rows", "tta_rows"):
            for row in doc.get(table, []):
                extra[table][(row["workload"], row["contender"], row.get("mode"))] = row
    names = list(workloads)
    merged = sorted(rows.values(), key=lambda r: (names.index(r["workload"]), _ORDER.get(r["contender"], 99)))
    for r in merged:
        for rep in r.get("repeats", []):
            if _ok(r) and _ok(rep):
                rep["drift"] = rep["train_seconds"] / r["train_seconds"] - 1.0
    add_speedups(merged)
    e2e = list(extra["e2e_rows"].values())
    tta = list(extra["tta_rows"].values())
    add_e2e_speedups(e2e)
    add_e2e_speedups(tta)
    return {
        "schema": SCHEMA,
        # the latest run's facts, completed by earlier runs' (a fastnn-only run records no torch version)
        "environment": _merged_environment([d["environment"] for d in partials]),
        "runs": [d["run"] | {"environment": d["environment"]} for d in partials],
        "workloads": workloads,
        "rows": merged,
        "e2e_rows": e2e,
        "tta_rows": tta,
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
        "# fastnn vs PyTorch and JAX on Fashion-MNIST",
        "",
        f"Device: {env.get('device')} (driver {env.get('driver_version')}); fastnn {env.get('fastnn')}, "
        f"cuBLASLt {env.get('cublaslt')}, cuDNN {env.get('cudnn')}, NVRTC {env.get('nvrtc')}; "
        f"PyTorch {env.get('torch', 'n/a')} (CUDA {env.get('torch_cuda', 'n/a')}); JAX {env.get('jax', 'n/a')} "
        f"({env.get('jax_device', 'n/a')}); {env.get('date')}.",
        "",
        "Every contender starts from the same weights, reads the samples in the same order and takes the same "
        "SGD steps. Times cover the timed epochs only: compilation, capture and a warm-up are in 'setup'. "
        "fastnn: `fit()` wall clock with a device sync; PyTorch: CUDA events; JAX: wall clock of each epoch "
        "with block_until_ready; NumPy: wall clock"
        + (", scaled from fewer epochs where marked *." if any(r.get("scaled") for r in rows) else "."),
        "",
    ]
    if rows:
        lines += ["## Training time (s)", "", "| contender | " + " | ".join(wl) + " |", "|---|" + "---:|" * len(wl)]
    for c in contenders:
        vals = []
        for w in wl:
            r = cell.get((w, c))
            v = "" if r is None else (_status(r) if not _ok(r) else _f(r["train_seconds"], ".3g"))
            vals.append(v + ("*" if r is not None and r.get("scaled") else ""))
        lines.append(f"| {c} | " + " | ".join(vals) + " |")
    if rows:
        lines += ["", "## Speedup of fastnn-mixed (contender time / fastnn-mixed time)", "",
                  "| contender | " + " | ".join(wl) + " |", "|---|" + "---:|" * len(wl)]  # fmt: skip
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
                lines.append(f"| {c} | {_status(r)} |  |  |  |  |  |  |  |  | {r.get('error', '')[:100]} |")
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
    lines += _jax_section(rows) + _drift_section(rows) + _e2e_section(doc) + _tta_section(doc)
    lines += ["", "Contenders:", ""]
    lines += [f"- `{c.name}`: {c.description}" + (f" (`XLA_FLAGS={c.xla_flags}`)" if c.xla_flags else "")
              for c in CONTENDERS if c.name in contenders]  # fmt: skip
    return "\n".join(lines) + "\n"


def _status(r: dict[str, Any]) -> str:
    return "n/a" if r.get("status") == "unavailable" else "failed"


def _jax_section(rows: list[dict[str, Any]]) -> list[str]:
    """The best JAX configuration found (least training time over the workloads all JAX configurations ran)."""
    from end_to_end import best_jax

    if not any(r.get("family") == "jax" and _ok(r) for r in rows):
        return []
    name, why = best_jax(rows)
    flags = next((c.xla_flags for c in CONTENDERS if c.name == name), "")
    return ["", "## Best JAX configuration", "",
            f"`{name}` (XLA_FLAGS=`{flags or '(none)'}`): {why}."]  # fmt: skip


def _drift_section(rows: list[dict[str, Any]]) -> list[str]:
    """Rows run again in a later device call: the drift between the calls."""
    reps = [(r, x) for r in rows for x in r.get("repeats", []) if x.get("drift") is not None]
    if not reps:
        return []
    lines = ["", "## Drift between device calls (the same contender run again)", "",
             "| workload | contender | first s | repeat s | drift |", "|---|---|---:|---:|---:|"]  # fmt: skip
    for r, x in reps:
        lines.append(f"| {r['workload']} | {r['contender']} | {r['train_seconds']:.3f} | {x['train_seconds']:.3f} "
                     f"| {x['drift'] * 100:+.1f}% |")  # fmt: skip
    return lines


def _e2e_cell(r: dict[str, Any] | None, key: str = "e2e_seconds") -> str:
    if r is None:
        return ""
    if r.get("status") != "ok":
        return "n/a" if r.get("status") == "unavailable" else "failed"
    return "not reached" if r.get(key) is None else f"{r[key]:.2f}"


def _e2e_section(doc: dict[str, Any]) -> list[str]:
    """End to end: from a fresh process to trained weights on the GPU, cold and warm caches."""
    rows = doc.get("e2e_rows", [])
    if not rows:
        return []
    cols = list(dict.fromkeys((r["workload"], r["mode"]) for r in rows))
    names = list(dict.fromkeys(r["contender"] for r in rows))
    cell = {(r["workload"], r["mode"], r["contender"]): r for r in rows}
    head = "| contender | " + " | ".join(f"{w} {m}" for w, m in cols) + " |"
    rule = "|---|" + "---:|" * len(cols)
    lines = [
        "",
        "## End to end (s): fresh process to trained weights on the GPU",
        "",
        "Import, data to the GPU, compile/capture/autotune and every epoch of the workload, each in a fresh "
        "process. Cold: empty fastnn kernel cache and torch inductor cache, no JAX persistent cache. Warm: "
        "those caches (JAX's persistent compilation cache on) populated by an earlier run.",
        "",
        head,
        rule,
    ]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(_e2e_cell(cell.get((w, m, n))) for w, m in cols) + " |")
    lines += ["", f"### Speedup of {E2E_REF} end to end (contender time / {E2E_REF} time)", "", head, rule]
    for n in names:
        if n == E2E_REF:
            continue
        vals = [cell.get((w, m, n), {}).get("speedup_e2e") for w, m in cols]
        lines.append(f"| {n} | " + " | ".join("" if v is None else f"{v:.2f}x" for v in vals) + " |")
    chosen = {r["chosen"] for r in rows if r.get("chosen")}
    lines += [""] + [f"- {c}" for c in sorted(chosen)]
    return lines


def _tta_section(doc: dict[str, Any]) -> list[str]:
    """Time to accuracy: first epoch at the target; end to end and training only."""
    rows = doc.get("tta_rows", [])
    if not rows:
        return []
    w = rows[0]
    lines = ["", f"## Time to {w.get('target_accuracy', 0.89):.0%} test accuracy", "",
             "MLP 784-256-256-10 on Fashion-MNIST (all 60,000 training images), AdamW (lr 1e-3, weight decay 0.01), "
             "batch 128, test accuracy checked after every epoch (at most 20), cold caches, a fresh process each.",
             "", "| contender | epochs | end to end s | training s | best acc | e2e speedup of fastnn "
             "| training speedup |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        ok = r.get("status") == "ok"
        lines.append(
            f"| {r['contender']} | {r.get('epochs_to_target') or ''} | {_e2e_cell(r)} "
            f"| {_e2e_cell(r, 'train_seconds')} | {_f(r.get('best_accuracy') if ok else None, '.4f')} "
            f"| {_f(r.get('speedup_e2e'), '.2f')} | {_f(r.get('speedup_train'), '.2f')} |"
        )
    return lines


def summary(doc: Any) -> Any:
    """The bench document without its per-step and per-epoch series (RAW_ONLY): an eighth of the size, and bench.md
    made from it is the same."""
    if isinstance(doc, dict):
        return {k: summary(v) for k, v in doc.items() if k not in RAW_ONLY}
    if isinstance(doc, list):
        return [summary(v) for v in doc]
    return doc


def write_summary(path: Path, doc: dict[str, Any]) -> None:
    """summary(doc) as JSON with one row per line, so a new run's diff shows which rows changed."""
    parts = []
    for key, value in summary(doc).items():
        if isinstance(value, list) and value:
            value_text = "[\n" + ",\n".join("  " + json.dumps(v) for v in value) + "\n ]"
        else:
            value_text = json.dumps(value)
        parts.append(f" {json.dumps(key)}: {value_text}")
    write_text(path, "{\n" + ",\n".join(parts) + "\n}\n")


def write_outputs(out: Path, plots: bool = True) -> dict[str, Any]:
    """Merge out/raw/partial/*.json into out/raw/bench.json, then write out/bench.md, out/bench_summary.json (and
    the graphs when asked)."""
    doc = merge(load_partials(out))
    write_json(out / RAW_DIR / "bench.json", doc)
    print(f"wrote {out / RAW_DIR / 'bench.json'}")
    _write_summaries(out, doc)
    if plots:
        try:
            import plots as plotting
        except ImportError as e:
            print(f"no graphs: {e}")
        else:
            for path in plotting.write_graphs(doc, out):
                print(f"wrote {path}")
    return doc


def _write_summaries(out: Path, doc: dict[str, Any]) -> None:
    (out / "bench.md").write_text(markdown(doc))
    write_summary(out / SUMMARY, doc)
    print(f"wrote {out / 'bench.md'} and {out / SUMMARY} ({len(doc['rows'])} rows)")


def main(argv: list[str] | None = None) -> int:
    """bench.md and bench_summary.json again from OUT/raw/bench.json (after a change to the report), no merge."""
    out = Path((argv if argv is not None else sys.argv[1:] or ["results"])[0])
    _write_summaries(out, json.loads((out / RAW_DIR / "bench.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
