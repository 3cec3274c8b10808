"""Partial results -> bench.json, bench.md and bench_summary.json: merge runs, compute fastnn's speedups, pick each
workload's fastest peer from one device call, write the markdown tables and the compact JSON kept in git.

    python benchmarks/report.py results/            # bench.md and bench_summary.json again from results/raw/bench.json
    python benchmarks/report.py --publish [results/]  # README's and docs' marked blocks from results/bench_summary.json
    python benchmarks/report.py --check [results/]    # exit 1 where a marked block differs from what --publish writes
"""

from __future__ import annotations

import argparse
import copy
import json
import textwrap
from pathlib import Path
from typing import Any

from workloads import CONTENDERS, settings, write_json, write_text

__all__ = [
    "PARTIAL_DIR",
    "RAW_DIR",
    "add_speedups",
    "batch_table",
    "best_peer",
    "calls",
    "empty_cell",
    "contender_settings",
    "families_table",
    "load_partials",
    "load_extra",
    "many_table",
    "markdown",
    "merge",
    "missing",
    "peers_table",
    "same_call_pairs",
    "scaling_table",
    "setup_table",
    "summary",
    "wrap",
    "write_outputs",
]

#: Raw outputs live under OUT/raw/, which git ignores (.gitignore): each run's partial file, the merged bench.json
#: (1.5 MB for the published run, most of it per-step losses) and the logs. OUT itself keeps the summaries
#: (bench.md, bench_summary.json, the graphs), which are what gets committed.
RAW_DIR = "raw"
PARTIAL_DIR = f"{RAW_DIR}/partial"
SUMMARY = "bench_summary.json"
#: Per-step and per-epoch series and repeated prose: in the raw bench.json only. bench.md needs none of them.
RAW_ONLY = frozenset(
    {"step_losses", "epoch_seconds", "warmup_epoch_seconds", "timing", "memory_note", "description", "accuracies"}
)
#: What a table cell says where the final run's plan has a row that no result holds.
NOT_MEASURED = "not measured in this run"
SCHEMA = 1
#: The fastnn row each contender's time is compared with "at matched precision".
MATCHED = {"fp32": "fastnn-fp32", "amp": "fastnn-mixed", "mixed": "fastnn-mixed", "fp16": "fastnn-fp16"}
_ORDER = {c.name: i for i, c in enumerate(CONTENDERS)}
#: fastnn's row in every comparison: engine="auto", mixed precision.
FASTNN = "fastnn-mixed"
#: The families whose rows are peers (fastnn's own engines and its NumPy engine are not).
PEER_FAMILIES = ("torch", "jax")
FAMILY_NAMES = {"torch": "PyTorch", "jax": "JAX"}


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


def instances(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row and drift repeat, each one contender's run of one workload in one device call."""
    return [x for r in rows for x in (r, *r.get("repeats", []))]


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """fastnn's speedup over each row and repeat (its time / fastnn's, same workload): vs fastnn-mixed and at matched
    precision. The fastnn row of the same run (device call) is preferred, a drift repeat included; else the
    published one."""
    by_key = {(r["workload"], r["contender"]): r for r in rows if _ok(r)}
    by_run = {(x["workload"], x["contender"], x["run_id"]): x for x in instances(rows) if _ok(x)}
    for r in instances(rows):
        for field, ref_name in (("fastnn_mixed", "fastnn-mixed"), ("fastnn_matched", MATCHED.get(r["precision"]))):
            ref = by_run.get((r["workload"], ref_name, r.get("run_id"))) or by_key.get((r["workload"], ref_name))
            if ref is None or not _ok(r) or ref["train_seconds"] <= 0:
                r[f"speedup_{field}"] = None
                continue
            r[f"speedup_{field}"] = r["train_seconds"] / ref["train_seconds"]
            r[f"speedup_{field}_ref"] = ref_name
            r[f"speedup_{field}_same_run"] = ref["run_id"] == r["run_id"]


def _e2e_ok(r: dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("e2e_seconds") is not None


def add_e2e_speedups(rows: list[dict[str, Any]]) -> None:
    """Per (workload, mode): row time / fastnn-mixed's time, end to end and training only (the same run only)."""
    ref = {(r["workload"], r.get("mode"), r.get("run_id")): r for r in rows if r["contender"] == FASTNN and _e2e_ok(r)}
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


def wrap(text: str, width: int = 115) -> str:
    """Prose wrapped for the markdown pages (tables never wrap)."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def network(w: dict[str, Any]) -> str:
    """A workload's network and batch in a few words: "784-1024-1024-1024-10, batch 128"."""
    return f"{'-'.join(str(s) for s in w['sizes'])}, batch {w['batch_size']}"


# ---- one device call's comparisons: fastnn against its fastest peer ---------------------------------------------


def calls(doc: dict[str, Any]) -> dict[str, int]:
    """Each run id's device call number, 1.. in the order the runs started (rows' first appearance without runs)."""
    ids = [r["run_id"] for r in doc.get("runs", [])]
    ids += [x.get("run_id") for x in instances(doc["rows"])]
    return {run: i for i, run in enumerate(dict.fromkeys(i for i in ids if i is not None), 1)}


Pair = tuple[dict[str, Any], dict[str, Any]]


def several_calls(doc: dict[str, Any]) -> bool:
    """Whether the rows come from more than one device call (then the tables name each row's call)."""
    return len({x.get("run_id") for x in instances(doc["rows"])}) > 1


def same_call_pairs(rows: list[dict[str, Any]], workload: str, families: tuple[str, ...] = PEER_FAMILIES) -> list[Pair]:
    """(peer, fastnn) for each peer row or repeat of `workload` whose device call also ran fastnn-mixed on it."""
    xs = [x for x in instances(rows) if x["workload"] == workload and _ok(x)]
    fast = {x.get("run_id"): x for x in xs if x["contender"] == FASTNN}
    return [(x, fast[x.get("run_id")]) for x in xs if x.get("family") in families and x.get("run_id") in fast]


def ratio(pair: Pair) -> float:
    """fastnn's speedup over the peer of a same-call pair: the peer's training time / fastnn's."""
    return pair[0]["train_seconds"] / pair[1]["train_seconds"]


def best_peer(rows: list[dict[str, Any]], workload: str, families: tuple[str, ...] = PEER_FAMILIES) -> Pair | None:
    """The workload's fastest peer and fastnn's row of the same call: in one call, the peer of least time; across
    calls (rows run apart), the peer fastnn leads least, so drift between calls cannot pick it. None: no pair."""
    return min(same_call_pairs(rows, workload, families), key=ratio, default=None)


def us_per_step(x: dict[str, Any]) -> str:
    """Time per step in microseconds, to 0.05% at least (so a printed ratio can be recomputed from it to 0.1%)."""
    us = (x.get("seconds_per_step") or x["train_seconds"] / x["steps"]) * 1e6
    return f"{us:.2f}" if us < 100 else f"{us:.1f}"


def _fastnn_cell(x: dict[str, Any]) -> str:
    engine = x.get("engine")
    return us_per_step(x) + (f" ({engine})" if engine else "")


def compared_workloads(doc: dict[str, Any]) -> list[str]:
    """The workloads, in plan order, with a peer and fastnn in one call."""
    return [w for w in doc["workloads"] if best_peer(doc["rows"], w) is not None]


def peers_table(doc: dict[str, Any]) -> list[str]:
    """Per workload: fastnn (engine "auto") against the fastest peer, both from one call, and fastnn's speedup."""
    ws = compared_workloads(doc)
    if not ws:
        return ["No workload has fastnn-mixed and a PyTorch or JAX row from one device call."]
    no = calls(doc)
    multi = several_calls(doc)
    lines = ["| workload | network, batch | fastnn `engine=\"auto\"` µs/step (engine) | fastest peer | peer µs/step "
             "| fastnn's speedup |" + (" call |" if multi else ""),
             "|---|---|---:|---|---:|---:|" + ("---:|" if multi else "")]  # fmt: skip
    shown = []
    for w in ws:
        pair = best_peer(doc["rows"], w)
        peer, fast = pair
        shown.append(peer["contender"])
        lines.append(f"| {w} | {network(doc['workloads'][w])} | {_fastnn_cell(fast)} | `{peer['contender']}` "
                     f"| {us_per_step(peer)} | {ratio(pair):.2f}x |"
                     + (f" {no.get(peer.get('run_id'), '?')} |" if multi else ""))  # fmt: skip
    lines += ["", wrap("fastnn's speedup = the peer's training time / fastnn's, both from the same device call"
                       + (" (the call column)" if multi else "") + "; the fastest peer is the PyTorch or JAX "
                       "contender of least time in that call. The peers' settings:"), ""]  # fmt: skip
    lines += [f"- `{c}`: `{contender_settings(doc, c)}`" for c in dict.fromkeys(shown)]
    return lines


def families_table(doc: dict[str, Any]) -> list[str]:
    """Per workload: the fastest JAX and the fastest PyTorch contender, each beside fastnn's row of its call."""
    ws = compared_workloads(doc)
    if not ws:
        return []
    head = "| workload |"
    rule = "|---|"
    for fam in PEER_FAMILIES:
        head += f" fastest {FAMILY_NAMES[fam]} | µs/step | fastnn, same call | fastnn's speedup |"
        rule += "---|---:|---:|---:|"
    lines = [head, rule]
    for w in ws:
        cells = []
        for fam in PEER_FAMILIES:
            pair = best_peer(doc["rows"], w, (fam,))
            cells += (
                ["", "", "", ""]
                if pair is None
                else [f"`{pair[0]['contender']}`", us_per_step(pair[0]), us_per_step(pair[1]), f"{ratio(pair):.2f}x"]
            )
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def contender_settings(doc: dict[str, Any], name: str) -> str:
    """A contender's settings as its rows recorded them (workloads.settings at run time), else from its definition."""
    recorded = next((r["settings"] for r in doc["rows"] if r["contender"] == name and r.get("settings")), None)
    if recorded:
        return recorded
    definition = next((c for c in CONTENDERS if c.name == name), None)
    return settings(definition) if definition is not None else "(not defined in this checkout)"


def contenders_list(doc: dict[str, Any], names: list[str]) -> list[str]:
    """`- name: description. Settings: ...` for each contender, from the definitions and the rows."""
    out = []
    for n in names:
        c = next((c for c in CONTENDERS if c.name == n), None)
        about = f"{c.description}. " if c is not None else ""
        out.append(f"- `{n}`: {about}Settings: `{contender_settings(doc, n)}`.")
    return out


def _lines(doc: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(label, contender, run id or None) of each line of the tables across workloads: one per contender, and
    when the rows come from several calls one per (contender, call), so each speedup's fastnn row is a line."""
    rows = doc["rows"]
    no = calls(doc)
    contenders = sorted({r["contender"] for r in rows}, key=lambda c: _ORDER.get(c, 99))
    if not several_calls(doc):
        return [(c, c, None) for c in contenders]
    out = []
    for c in contenders:
        runs = sorted({x.get("run_id") for x in instances(rows) if x["contender"] == c}, key=lambda r: no.get(r, 0))
        out += [(f"{c} (call {no.get(run, '?')})", c, run) for run in runs]
    return out


def _cell(doc: dict[str, Any], w: str, c: str, run: str | None) -> dict[str, Any] | None:
    return next((x for x in instances(doc["rows"]) if x["workload"] == w and x["contender"] == c
                 and (run is None or x.get("run_id") == run)), None)  # fmt: skip


def markdown(doc: dict[str, Any]) -> str:
    """bench.md: environment, the time and speedup tables across workloads, the fastest peers, and one detail table
    per workload."""
    doc = {**doc, "rows": copy.deepcopy(doc["rows"])}
    add_speedups(doc["rows"])  # the drift repeats' too (summaries written before they had them)
    env = doc["environment"]
    rows = doc["rows"]
    wl = {w: spec for w, spec in doc["workloads"].items() if any(r["workload"] == w for r in rows)}
    contenders = sorted({r["contender"] for r in rows}, key=lambda c: _ORDER.get(c, 99))
    lines_ = _lines(doc)
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
    if several_calls(doc):
        lines += ["The rows come from several device calls; each line of the tables across workloads is one "
                  "contender in one call, and each speedup compares rows of one call (the fastnn-mixed line of "
                  "the same call) where that call ran fastnn-mixed.", ""]  # fmt: skip
    if rows:
        lines += ["## Training time (s)", "", "| contender | " + " | ".join(wl) + " |", "|---|" + "---:|" * len(wl)]
    has = {(x["workload"], x["contender"]) for x in instances(rows)}
    for label, c, run in lines_:
        vals = []
        for w in wl:
            r = _cell(doc, w, c, run)
            if r is None:  # another call's line may hold it; else it is planned and missing, or not planned
                v = "" if (w, c) in has else empty_cell(w, c)
            else:
                v = _status(r) if not _ok(r) else _f(r["train_seconds"], ".3g")
            vals.append(v + ("*" if r is not None and r.get("scaled") else ""))
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    if rows:
        lines += ["", "## Speedup of fastnn-mixed (contender time / fastnn-mixed time)", "",
                  "| contender | " + " | ".join(wl) + " |", "|---|" + "---:|" * len(wl)]  # fmt: skip
    no = calls(doc)
    for label, c, run in lines_:
        if c == FASTNN:
            continue
        vals = []
        for w in wl:
            r = _cell(doc, w, c, run)
            s = None if r is None else r.get("speedup_fastnn_mixed")
            if s is not None and not r.get("speedup_fastnn_mixed_same_run", True) and several_calls(doc):
                ref = _cell(doc, w, FASTNN, None)  # no fastnn-mixed in this row's call: the first row's
                vals.append(f"{s:.2f}x (vs call {no.get(ref.get('run_id'), '?')})")
            else:
                vals.append("" if s is None else f"{s:.2f}x")
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    if compared_workloads(doc):
        lines += ["", "## Fastest peer per workload", "", *peers_table(doc),
                  "", "### The fastest of each family", "", *families_table(doc)]  # fmt: skip
    for w, spec in wl.items():
        lines += [
            "",
            f"### {w}: {_describe(spec)}",
            "",
            "| contender | call | time s | ms/step | s/epoch | setup s | final train loss | test acc | peak MiB "
            "| fastnn-mixed speedup | matched speedup | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for c in contenders:
            for r in [x for x in instances(rows) if x["workload"] == w and x["contender"] == c]:
                call = no.get(r.get("run_id"), "")
                if not _ok(r):
                    error = r.get("error", "")[:100]
                    lines.append(f"| {c} | {call} | {_status(r)} |  |  |  |  |  |  |  |  | {error} |")
                    continue
                matched = r.get("speedup_fastnn_matched")
                matched_s = "" if matched is None else f"{matched:.2f} ({r.get('speedup_fastnn_matched_ref')})"
                lines.append(
                    f"| {c} | {call} | {_f(r['train_seconds'], '.3f')}{'*' if r.get('scaled') else ''} "
                    f"| {_f(r.get('seconds_per_step'), '.4f', 1e3)} | {_f(r.get('seconds_per_epoch'), '.3f')} "
                    f"| {_f(r.get('setup_seconds'), '.2f')} | {_f(r.get('final_train_loss'), '.4f')} "
                    f"| {_f(r.get('test_accuracy'), '.4f')} | {_f(r.get('peak_memory_bytes'), '.0f', 2**-20)} "
                    f"| {_f(r.get('speedup_fastnn_mixed'), '.2f')} "
                    f"| {matched_s} "
                    f"| {r.get('note', '')} |"
                )
    lines += _batch_section(doc)
    lines += _jax_section(rows) + _drift_section(rows) + _e2e_section(doc) + _tta_section(doc)
    lines += _many_section(doc) + _scaling_section(doc) + _setup_section(doc) + _missing_section(doc)
    lines += ["", "## Contenders", "", *contenders_list(doc, contenders)]
    return "\n".join(lines) + "\n"


def empty_cell(workload: str, contender: str) -> str:
    """A training-table cell without a row: NOT_MEASURED where the final run's plan has it, else empty."""
    from final import planned_training

    return NOT_MEASURED if (workload, contender) in planned_training() else ""


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


def e2e_tables(doc: dict[str, Any]) -> list[str]:
    """End to end: seconds per (workload, mode) and contender, then fastnn-mixed's speedups (same call)."""
    rows = doc.get("e2e_rows", [])
    if not rows:
        return []
    cols = list(dict.fromkeys((r["workload"], r["mode"]) for r in rows))
    names = list(dict.fromkeys(r["contender"] for r in rows))
    cell = {(r["workload"], r["mode"], r["contender"]): r for r in rows}
    head = "| contender | " + " | ".join(f"{w} {m}" for w, m in cols) + " |"
    rule = "|---|" + "---:|" * len(cols)
    lines = [head, rule]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(_e2e_cell(cell.get((w, m, n))) for w, m in cols) + " |")
    lines += ["", f"Speedup of {FASTNN} end to end (contender time / {FASTNN} time):", "", head, rule]
    for n in names:
        if n == FASTNN:
            continue
        vals = [cell.get((w, m, n), {}).get("speedup_e2e") for w, m in cols]
        lines.append(f"| {n} | " + " | ".join("" if v is None else f"{v:.2f}x" for v in vals) + " |")
    chosen = {r["chosen"] for r in rows if r.get("chosen")}
    return lines + [""] + [f"- {c}" for c in sorted(chosen)]


def _e2e_section(doc: dict[str, Any]) -> list[str]:
    """End to end: from a fresh process to trained weights on the GPU, cold and warm caches."""
    if not doc.get("e2e_rows"):
        return []
    return [
        "",
        "## End to end (s): fresh process to trained weights on the GPU",
        "",
        "Import, data to the GPU, compile/capture/autotune and every epoch of the workload, each in a fresh "
        "process. Cold: empty fastnn kernel cache and torch inductor cache, no JAX persistent cache. Warm: "
        "those caches (JAX's persistent compilation cache on) populated by an earlier run.",
        "",
        *e2e_tables(doc),
    ]


def tta_table(doc: dict[str, Any]) -> list[str]:
    """Time to accuracy per workload: the first epoch at its target; end to end (from a fresh process, set-up
    included: the seeds' measure) and training only, and fastnn's speedups."""
    rows = doc.get("tta_rows", [])
    if not rows:
        return []
    lines = ["| workload | target | contender | epochs | end to end s | training s | best acc | e2e speedup of "
             "fastnn | training speedup |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        ok = r.get("status") == "ok"
        target = r.get("target_accuracy")
        lines.append(
            f"| {r['workload']} | {_f(target, '.2f')} | {r['contender']} | {r.get('epochs_to_target') or ''} "
            f"| {_e2e_cell(r)} | {_e2e_cell(r, 'train_seconds')} "
            f"| {_f(r.get('best_accuracy') if ok else None, '.4f')} "
            f"| {_f(r.get('speedup_e2e'), '.2f')} | {_f(r.get('speedup_train'), '.2f')} |"
        )
    return lines


def _tta_section(doc: dict[str, Any]) -> list[str]:
    """Time to accuracy: first epoch at the target; end to end and training only."""
    if not doc.get("tta_rows"):
        return []
    from workloads import tta_workloads

    about = [f"{w.name}: {'-'.join(map(str, w.sizes))}, {w.optimizer.upper()} lr {w.lr}, batch {w.batch_size}, "
             f"to {w.target_accuracy:.2f} in at most {w.epochs} epochs" for w in tta_workloads()]  # fmt: skip
    return ["", "## Time to a test accuracy", "",
            wrap("Fashion-MNIST (all 60,000 training images), test accuracy checked after every epoch, cold caches, "
                 "a fresh process each; end to end counts from the process start, set-up included. " +
                 "; ".join(about) + "."), "", *tta_table(doc)]  # fmt: skip


# ---- the final run's other benchmarks: batch grid, many models, scaling, and what was not measured -------------


def load_extra(out: Path) -> dict[str, Any]:
    """bench_many.py's rows (out/raw/many/*.json), bench_scaling.py's (out/raw/scaling/*.json), bench_setup.py's
    (out/raw/setup/*.json) and final.py's call records (out/raw/calls.json), for the report's many-model, scaling,
    set-up and coverage tables."""
    many, scaling = [], []
    for path in sorted((out / RAW_DIR / "many").glob("*.json")):
        many += [r | {"source": path.name} for r in json.loads(path.read_text())]
    for path in sorted((out / RAW_DIR / "scaling").glob("*.json")):
        d = json.loads(path.read_text())
        scaling += [r | {"device": d.get("device"), "gpus": d.get("gpus"), "source": path.name} for r in d["rows"]]
    setup = []
    for path in sorted((out / RAW_DIR / "setup").glob("*.json")):
        d = json.loads(path.read_text())
        setup += [r | {"device": d.get("device"), "source": path.name} for r in d["rows"]]
    calls_path = out / RAW_DIR / "calls.json"
    final_calls = json.loads(calls_path.read_text()) if calls_path.exists() else []
    return {"many_rows": many, "scaling_rows": scaling, "setup_rows": setup, "final_calls": final_calls}


def batch_table(doc: dict[str, Any]) -> list[str]:
    """The batch grid: per (h, batch), fastnn against the fastest peer of the same call; unmeasured cells say so."""
    from workloads import batch_grid

    grid = batch_grid()
    if not any(r["workload"] in {w.name for w in grid} for r in doc["rows"]):
        return []
    lines = ["| h | batch | workload | fastnn `engine=\"auto\"` µs/step (engine) | fastest peer | peer µs/step "
             "| fastnn's speedup |", "|---:|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for w in grid:
        pair = best_peer(doc["rows"], w.name)
        if pair is None:
            lines.append(f"| {w.hidden} | {w.batch_size} | {w.name} | {NOT_MEASURED} |  |  |  |")
            continue
        peer, fast = pair
        lines.append(f"| {w.hidden} | {w.batch_size} | {w.name} | {_fastnn_cell(fast)} | `{peer['contender']}` "
                     f"| {us_per_step(peer)} | {ratio(pair):.2f}x |")  # fmt: skip
    return lines


def _batch_section(doc: dict[str, Any]) -> list[str]:
    table = batch_table(doc)
    if not table:
        return []
    return ["", "## The batch grid: batch 64-512 at h = 256, 1024 and 4096", "",
            wrap("MLP 784-h-h-h-10, SGD lr 0.003, the first 32,000 training images; each ratio from rows of one "
                 "device call."), "", *table]  # fmt: skip


def many_table(doc: dict[str, Any]) -> list[str]:
    """K models at once: µs per model and step of each contender, and fastnn's speedup over the faster peer."""
    rows = doc.get("many_rows", [])
    if not rows:
        return []
    from final import many_plan

    plan = many_plan()
    names = list(dict.fromkeys([c for _, _, c in plan] + [r["contender"] for r in rows]))
    cell = {(r["workload"], r["models"], r["contender"]): r for r in rows}
    lines = ["| workload | K | " + " | ".join(f"{n} µs/model-step" for n in names)
             + " | fastnn's speedup over the faster peer | best test acc (fastnn) |",
             "|---|---:|" + "---:|" * (len(names) + 2)]  # fmt: skip
    for w, k in dict.fromkeys((w, k) for w, k, _ in plan):
        vals = [f"{cell[(w, k, n)]['per_model_step_us']:.3f}" if (w, k, n) in cell else NOT_MEASURED for n in names]
        mine = cell.get((w, k, "fastnn"))
        peers = [cell[(w, k, n)] for n in names if not n.startswith("fastnn") and (w, k, n) in cell]
        speed = f"{min(p['epoch_s'] for p in peers) / mine['epoch_s']:.2f}x" if mine and peers else ""
        acc = f"{mine['best_accuracy']:.4f}" if mine else ""
        lines.append(f"| {w} | {k} | " + " | ".join(vals) + f" | {speed} | {acc} |")
    return lines


def _many_section(doc: dict[str, Any]) -> list[str]:
    table = many_table(doc)
    if not table:
        return []
    return ["", "## Many models at once (bench_many.py)", "",
            wrap("K models trained together for one epoch of Fashion-MNIST, each its own learning rate, L2 penalty "
                 "and seed: fastnn's MultiTrainer, JAX vmap and torch.func + vmap (CUDA graphs). Wall clock of the "
                 "timed epoch per model and step; a missing cell is a run that was not made or failed (its call's "
                 "log says which)."), "", *table]  # fmt: skip


def scaling_table(doc: dict[str, Any]) -> list[str]:
    """bench_scaling.py's rows: samples/s of each run against one GPU without a group."""
    rows = doc.get("scaling_rows", [])
    if not rows:
        return []
    lines = ["| workload | global batch | run | samples/s | vs 1 GPU | final loss |", "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['global_batch']} | {r['run']} | {r['samples_per_s']:,.0f} "
                     f"| {r['vs_one_gpu']:.2f}x | {r['final_loss']:.4f} |")  # fmt: skip
    return lines


def _scaling_section(doc: dict[str, Any]) -> list[str]:
    table = scaling_table(doc)
    if not table:
        return []
    first = doc["scaling_rows"][0]
    return ["", f"## Data-parallel scaling ({first.get('gpus')}x {first.get('device')})", "", *table]


def setup_table(doc: dict[str, Any]) -> list[str]:
    """bench_setup.py's rows: a fresh process to one trained epoch (whole process, s), cold, warm and warm again."""
    from final import SETUP_MODES

    rows = [r for r in doc.get("setup_rows", []) if r.get("mode")]
    if not rows:
        return []
    cell = {(r["workload"], r["contender"], r["mode"]): r for r in rows}
    lines = ["| workload | contender | " + " | ".join(SETUP_MODES) + " | training (warm) |",
             "|---|---|" + "---:|" * (len(SETUP_MODES) + 1)]  # fmt: skip
    for w, c in dict.fromkeys((r["workload"], r["contender"]) for r in rows):
        vals = []
        for m in SETUP_MODES:
            r = cell.get((w, c, m))
            seconds = None if r is None else r.get("process_seconds") or r.get("e2e_seconds")
            vals.append(NOT_MEASURED if r is None else f"{seconds:.2f}" if r.get("status") == "ok" and seconds
                        else str(r.get("status")))  # fmt: skip
        warm = cell.get((w, c, "warm"))
        train = warm.get("train_seconds") if warm and warm.get("status") == "ok" else None
        lines.append(f"| {w} | {c} | " + " | ".join(vals) + f" | {_f(train, '.3g')} |")
    return lines


def _setup_section(doc: dict[str, Any]) -> list[str]:
    table = setup_table(doc)
    if not table:
        return []
    device = doc["setup_rows"][0].get("device")
    return ["", f"## From a fresh process to one trained epoch (bench_setup.py, {device})", "",
            wrap("Seconds from starting the interpreter to its exit, one epoch trained, each in a fresh process; "
                 "cold: empty kernel, autotuning, dataset and compilation caches; warm: filled by the run "
                 "before."), "", *table]  # fmt: skip


def missing(doc: dict[str, Any]) -> list[str]:
    """Every cell of the final run's plan (final.py) that no result holds, and every row that could not run, with
    why: one line per contender or table."""
    from final import expected_cells

    have = {(t, w, c, m) for t, w, c, m in _measured(doc)}
    out = []
    for table, cells in expected_cells().items():
        lost: dict[str, list[str]] = {}
        for w, c, m in cells:
            if (table, w, c, m) not in have and not (table == "train" and ("train", w, c, "n/a") in have):
                lost.setdefault(c, []).append(w + (f" {m}" if m else ""))
        for c, ws in lost.items():
            out.append(f"- {table}, `{c}`: {NOT_MEASURED}: {', '.join(ws)}")
    for x in instances(doc["rows"]):
        if not _ok(x):
            why = str(x.get("error", "")).splitlines()[0][:160] if x.get("error") else ""
            out.append(f"- train, `{x['contender']}` on {x['workload']}: {_status(x)}" + (f" ({why})" if why else ""))
    for table in ("e2e_rows", "tta_rows", "setup_rows"):
        for x in doc.get(table, []):
            if table == "setup_rows" and x.get("status") == "skipped":
                continue  # not in the plan (the NumPy engine on the wide MLPs)
            if x.get("status") != "ok":
                why = str(x.get("error", "")).splitlines()[0][:160] if x.get("error") else ""
                out.append(f"- {table[:-5]}, `{x['contender']}` on {x['workload']} {x.get('mode', '')}: "
                           f"{x.get('status')}" + (f" ({why})" if why else ""))  # fmt: skip
            elif table == "tta_rows" and not x.get("reached"):
                out.append(f"- tta, `{x['contender']}` on {x['workload']}: target not reached in "
                           f"{len(x.get('epochs') or [])} epochs (best {x.get('best_accuracy')})")  # fmt: skip
    return out


def _measured(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(table, workload, contender, mode) of every result the document holds (a refused engine counts: its cell
    says why)."""
    out = [("train", x["workload"], x["contender"], "" if _ok(x) else "n/a") for x in instances(doc["rows"])]
    out += [("e2e", r["workload"], r["contender"], r.get("mode", "")) for r in doc.get("e2e_rows", [])]
    out += [("tta", r["workload"], r["contender"], "") for r in doc.get("tta_rows", [])]
    out += [("many", f"{r['workload']} K={r['models']}", r["contender"], "") for r in doc.get("many_rows", [])]
    out += [("scaling", r["workload"], r["run"], "") for r in doc.get("scaling_rows", [])]
    out += [("setup", r["workload"], r["contender"], r["mode"]) for r in doc.get("setup_rows", []) if r.get("mode")]
    jax = [c.name for c in CONTENDERS if c.family == "jax"]
    out += [(t, w, "jax-best", m) for t, w, c, m in out if c in jax and t in ("e2e", "tta")]
    return out


def _missing_section(doc: dict[str, Any]) -> list[str]:
    lines = missing(doc)
    if not lines:
        return ["", "## Not measured", "", "Every cell of the final run's plan (benchmarks/final.py) is measured."]
    return ["", "## Not measured, or not run", "",
            wrap("The cells of the final run's plan (`python benchmarks/final.py --list`) that these results do not "
                 "hold, and the rows that could not run, with why:"), "", *lines]  # fmt: skip


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
    doc = merge(load_partials(out)) | load_extra(out)
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
    """bench.md and bench_summary.json again from OUT/raw/bench.json (after a change to the report), no merge; or,
    with --publish / --check, the README's and docs' marked blocks from OUT/bench_summary.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="results folder (default: results; --publish/--check: benchmarks/results)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--publish", action="store_true", help="rewrite the marked blocks of README.md and docs/")
    mode.add_argument("--check", action="store_true", help="exit 1 where a marked block differs from --publish's")
    args = p.parse_args(argv)
    if args.publish or args.check:
        import publish

        return publish.main(Path(args.out) if args.out else publish.RESULTS, check=args.check)
    out = Path(args.out or "results")
    _write_summaries(out, json.loads((out / RAW_DIR / "bench.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
