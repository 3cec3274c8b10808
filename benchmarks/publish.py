"""The README's and the docs' benchmark numbers, made from a results folder's bench_summary.json (issue 27).

Every benchmark number those pages print sits between `<!-- bench:NAME -->` and `<!-- /bench -->`; this module
makes each block from the results and rewrites it in place, leaving the text around the markers alone:

    python benchmarks/report.py --publish [benchmarks/results]   # rewrite the blocks of TARGETS
    python benchmarks/report.py --check [benchmarks/results]     # exit 1 where a block differs (a test runs this)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from end_to_end import best_jax
from report import (
    FAMILY_NAMES,
    FASTNN,
    NOT_MEASURED,
    PEER_FAMILIES,
    SUMMARY,
    _ok,
    batch_table,
    best_peer,
    compared_workloads,
    contenders_list,
    e2e_tables,
    empty_cell,
    families_table,
    instances,
    many_table,
    missing,
    network,
    peers_table,
    ratio,
    scaling_table,
    setup_table,
    tta_table,
    us_per_step,
    wrap,
)

__all__ = ["BLOCKS", "RESULTS", "TARGETS", "blocks", "headline", "main", "publish", "rewrite", "summary_block"]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: The pages with marked blocks, relative to the repository.
TARGETS = ("README.md", "docs/index.md", "docs/benchmarks/index.md")
#: A ratio within this of 1 is "level" in the headline: closer than the drift between device calls.
LEVEL = 0.02
_BLOCK = re.compile(r"<!-- bench:(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)<!-- /bench -->", re.S)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def _device(doc: dict[str, Any]) -> str:
    return str(doc["environment"].get("device") or "GPU")


def headline(doc: dict[str, Any]) -> str:
    """Where fastnn leads the fastest peer, by how much, where it is level and where it trails: one call's ratios."""
    rows = doc["rows"]
    pairs = {w: best_peer(rows, w) for w in compared_workloads(doc)}
    if not pairs:
        return "No results yet with fastnn and a PyTorch or JAX contender in one device call."
    lead, level, behind = [], [], []
    for w, pair in pairs.items():
        r, peer = ratio(pair), pair[0]["contender"]
        if r >= 1 + LEVEL:
            lead.append(f"{w} ({r:.2f}x over `{peer}`)")
        elif r > 1 - LEVEL:
            level.append(f"{w} ({r:.2f}x, `{peer}`)")
        else:
            behind.append(f"{w} ({r:.2f}x: `{peer}` is {1 / r - 1:.0%} faster)")
    clauses = [f"fastnn (`engine=\"auto\"`, mixed precision) trains faster than the fastest PyTorch or JAX setup "
               f"measured on {len(lead)} of {len(pairs)} workloads" + (f": {_join(lead)}" if lead else "")]  # fmt: skip
    if level:
        clauses.append(f"it is level with the fastest peer (within {LEVEL:.0%}) on {_join(level)}")
    if behind:
        clauses.append(f"it is slower on {_join(behind)}")
    text = f"On one {_device(doc)}, " + "; ".join(clauses) + "."
    per_family = []
    for fam in PEER_FAMILIES:
        best = [p for w in pairs if (p := best_peer(rows, w, (fam,))) is not None]
        if best:
            names = ", ".join(f"`{n}`" for n in dict.fromkeys(p[0]["contender"] for p in best))
            per_family.append(f"{_range([ratio(p) for p in best])} over {FAMILY_NAMES[fam]}'s fastest ({names})")
    if per_family:
        text += f" Across the workloads, fastnn's speedup is {_join(per_family)}."
    text += _e2e_sentence(doc)
    text += " Each ratio is the peer's training time over fastnn's, both measured in the same device call."
    return wrap(text)


def _e2e_sentence(doc: dict[str, Any]) -> str:
    """From a fresh process to trained weights, cold caches, on the first end-to-end workload; "" without rows."""
    cold = [r for r in doc.get("e2e_rows", []) if r.get("mode") == "cold" and r.get("status") == "ok"
            and r.get("e2e_seconds") is not None]  # fmt: skip
    mine = next((r for r in cold if r["contender"] == FASTNN), None)
    if mine is None:
        return ""
    others = [r for r in cold if r["workload"] == mine["workload"] and r.get("family") in PEER_FAMILIES
              and r.get("run_id") == mine.get("run_id")]  # fmt: skip
    if not others:
        return ""
    against = _join([f"{r['e2e_seconds']:.2f} s for `{r['contender']}`" for r in others])
    return (f" From a fresh process to trained weights with cold caches, on {mine['workload']} fastnn takes "
            f"{mine['e2e_seconds']:.2f} s against {against}.")  # fmt: skip


def peers_block(doc: dict[str, Any]) -> str:
    """The README's table: per workload, fastnn against the fastest peer of the same call."""
    intro = wrap(f"Training time per step in microseconds on one {_device(doc)}, Fashion-MNIST, timed epochs "
                  "only (setup, compilation and capture excluded), fastnn against the fastest PyTorch or JAX "
                  "contender of the same device call:")  # fmt: skip
    return "\n".join([intro, "", *peers_table(doc)])


def summary_block(doc: dict[str, Any]) -> str:
    """The README's first-screen table: per workload, fastnn's time per step beside the fastest peer of its call."""
    ws = compared_workloads(doc)
    if not ws:
        return "No results yet with fastnn and a PyTorch or JAX contender in one device call."
    intro = wrap(f"Training time per step on one {_device(doc)} (Fashion-MNIST, µs/step, timed epochs only): fastnn "
                 "against the fastest PyTorch or JAX setup measured in the same device call.")  # fmt: skip
    lines = [intro, "", "| workload | fastnn | fastest peer | speedup |", "|---|---:|---|---:|"]
    for w in ws:
        pair = best_peer(doc["rows"], w)
        peer, fast = pair
        lines.append(f"| {w}: {network(doc['workloads'][w])} | {us_per_step(fast)} | {us_per_step(peer)} "
                     f"`{peer['contender']}` | {ratio(pair):.2f}x |")  # fmt: skip
    return "\n".join(lines)


def _version(v: Any) -> str:
    """cuBLASLt's and cuDNN's integer versions (130100, 91900) as 13.1.0 and 9.19.0; anything else as it is."""
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if isinstance(v, int) and v >= 10000 else str(v)


def _driver(v: Any) -> str:
    """cuDriverGetVersion's integer (13000) as the CUDA version it supports."""
    return f"for CUDA {v // 1000}.{v % 1000 // 10}" if isinstance(v, int) else str(v)


def setup_block(doc: dict[str, Any]) -> str:
    """The device, the library versions, the date and the runs ("calls") whose rows the committed tables hold."""
    env = doc["environment"]
    n = len({x.get("run_id") for x in instances(doc["rows"])}) or 1
    text = (f"The committed run: one **{_device(doc)}** (driver {_driver(env.get('driver_version'))}, cuBLASLt "
            f"{_version(env.get('cublaslt'))}, cuDNN {_version(env.get('cudnn'))}), fastnn {env.get('fastnn')}, "
            f"PyTorch {env.get('torch', 'n/a')} (CUDA {env.get('torch_cuda', 'n/a')}), JAX {env.get('jax', 'n/a')}, "
            f"{str(env.get('date', ''))[:10]}, from {n} run{'s' if n > 1 else ''} of `bench_mnist.py` (the tables' "
            f"calls; several runs may share one device call).")  # fmt: skip
    drift = [x["drift"] for r in doc["rows"] for x in r.get("repeats", []) if x.get("drift") is not None]
    if drift:
        text += (f" Rows run again in a later call (drift repeats) moved by {min(drift):+.1%} to {max(drift):+.1%}; "
                 "every speedup compares rows of one call.")  # fmt: skip
    return wrap(text)


def contenders_block(doc: dict[str, Any]) -> str:
    """Every contender of the run with its settings (from the rows or the definitions), and the best JAX one."""
    names = list(dict.fromkeys(r["contender"] for r in doc["rows"]))
    lines = contenders_list(doc, names)
    if any(r.get("family") == "jax" and _ok(r) for r in doc["rows"]):
        name, why = best_jax(doc["rows"])
        lines += ["", wrap(f"The best JAX configuration (for the end-to-end and time-to-accuracy tables' "
                            f"`jax-best`): `{name}`, {why}.")]  # fmt: skip
    return "\n".join(lines)


def times_block(doc: dict[str, Any]) -> str:
    """Microseconds per step of every contender on every workload (each contender's first row)."""
    rows = doc["rows"]
    ws = [w for w in doc["workloads"] if any(r["workload"] == w for r in rows)]
    names = list(dict.fromkeys(r["contender"] for r in rows))
    cell = {(r["workload"], r["contender"]): r for r in rows}
    lines = ["| contender | " + " | ".join(ws) + " |", "|---|" + "---:|" * len(ws)]
    for n in names:
        vals = []
        for w in ws:
            r = cell.get((w, n))
            if r is None:
                vals.append(empty_cell(w, n))
            elif not _ok(r):
                vals.append("n/a" if r.get("status") == "unavailable" else "failed")
            else:
                vals.append(us_per_step(r) + ("*" if r.get("scaled") else ""))
        lines.append(f"| `{n}` | " + " | ".join(vals) + " |")
    specs = doc["workloads"]
    about = "; ".join(f"{w}: {network(specs[w])}, {specs[w]['steps']:,} steps" for w in ws)
    lines += ["", wrap(f"Workloads: {about}." + (" * scaled from fewer epochs." if any(
        r.get("scaled") for r in rows) else ""))]  # fmt: skip
    return "\n".join(lines)


def families_block(doc: dict[str, Any]) -> str:
    """The fastest JAX and the fastest PyTorch contender per workload, each beside fastnn's row of its call."""
    table = families_table(doc)
    if not table:
        return "No workload has fastnn-mixed and a PyTorch or JAX row from one device call."
    return "\n".join([*table, "", wrap("fastnn's speedup = the peer's time / fastnn's time of the same call "
                                        "(the two µs/step columns beside it).")])  # fmt: skip


def behind_block(doc: dict[str, Any]) -> str:
    """The workloads where the fastest peer is ahead of or level with fastnn, and the test accuracies reached."""
    rows = doc["rows"]
    pairs = {w: best_peer(rows, w) for w in compared_workloads(doc)}
    behind = {w: p for w, p in pairs.items() if ratio(p) <= 1 - LEVEL}
    level = {w: p for w, p in pairs.items() if 1 - LEVEL < ratio(p) < 1 + LEVEL}
    parts = []
    if not behind:
        parts.append("No peer is faster than fastnn on any workload measured.")
    else:
        items = [f"{w} (`{p[0]['contender']}`, {1 / ratio(p) - 1:.0%} faster: {us_per_step(p[0])} against "
                 f"{us_per_step(p[1])} µs/step)" for w, p in behind.items()]  # fmt: skip
        parts.append(f"The fastest peer is ahead of fastnn on {_join(items)}.")
    if level:
        parts.append(f"They are level (within {LEVEL:.0%}) on {_join(list(level))}.")
    big = [w for w in {**behind, **level} if doc["workloads"][w]["batch_size"] > 32 and w != "logreg"]
    if big:
        parts.append(f"{_join(big)} {'is' if len(big) == 1 else 'are'} among the larger batches, where "
                     "cuBLASLt's GEMMs are efficient and fastnn's persistent engines have least to gain.")  # fmt: skip
    text = wrap(" ".join(parts))
    return text + "\n\n" + wrap(_accuracy(doc))


def _accuracy(doc: dict[str, Any]) -> str:
    """Test accuracy after the same steps: the range over the contenders of each workload, fp16 weights apart."""
    spans, fp16 = [], []
    for w in doc["workloads"]:
        accs = [r["test_accuracy"] for r in doc["rows"] if r["workload"] == w and _ok(r)
                and r.get("test_accuracy") is not None and r.get("precision") != "fp16"]  # fmt: skip
        if accs:
            spans.append(f"{w} {min(accs):.4f}-{max(accs):.4f}")
        fp16 += [f"{w} {r['test_accuracy']:.4f}" for r in doc["rows"] if r["workload"] == w and _ok(r)
                 and r.get("precision") == "fp16" and r.get("test_accuracy") is not None]  # fmt: skip
    if not spans:
        return ""
    text = "Test accuracy after training, lowest to highest over the contenders of each workload: " + "; ".join(spans)
    if fp16:
        text += " (fp16-weight rows apart: " + "; ".join(fp16) + ")"
    return text + "."


def e2e_block(doc: dict[str, Any]) -> str:
    return "\n".join(e2e_tables(doc)) or "No end-to-end rows in this run."


def tta_block(doc: dict[str, Any]) -> str:
    return "\n".join(tta_table(doc)) or f"Time to accuracy: {NOT_MEASURED}."


def batch_block(doc: dict[str, Any]) -> str:
    return "\n".join(batch_table(doc)) or f"The batch grid (batch 64-512 at h = 256, 1024, 4096): {NOT_MEASURED}."


def many_block(doc: dict[str, Any]) -> str:
    return "\n".join(many_table(doc)) or f"Many models at once (bench_many.py): {NOT_MEASURED}."


def scaling_block(doc: dict[str, Any]) -> str:
    rows = doc.get("scaling_rows", [])
    if not rows:
        return f"Data-parallel scaling (bench_scaling.py): {NOT_MEASURED}."
    return f"{rows[0].get('gpus')}x {rows[0].get('device')}:\n\n" + "\n".join(scaling_table(doc))


def startup_block(doc: dict[str, Any]) -> str:
    rows = [r for r in doc.get("setup_rows", []) if r.get("mode")]
    if not rows:
        return f"From a fresh process to one trained epoch (bench_setup.py): {NOT_MEASURED}."
    return f"{rows[0].get('device')}, seconds:\n\n" + "\n".join(setup_table(doc))


def missing_block(doc: dict[str, Any]) -> str:
    """The closing list: every cell of the final run's plan these results lack, and every row that could not run."""
    lines = missing(doc)
    if not lines:
        return "Every cell of the final run's plan (`python benchmarks/final.py --list`) is measured."
    intro = wrap(f"Cells of the final run's plan (`python benchmarks/final.py --list`) these results lack "
                 f"({len(lines)} lines), and rows that could not run, with why:")  # fmt: skip
    return "\n".join([intro, "", *lines])


#: Block name -> what makes it.
BLOCKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "headline": headline,
    "summary": summary_block,
    "peers": peers_block,
    "setup": setup_block,
    "contenders": contenders_block,
    "times": times_block,
    "families": families_block,
    "behind": behind_block,
    "e2e": e2e_block,
    "tta": tta_block,
    "batch": batch_block,
    "many": many_block,
    "scaling": scaling_block,
    "startup": startup_block,
    "missing": missing_block,
}


def blocks(doc: dict[str, Any]) -> dict[str, str]:
    """Every block's markdown made from one bench document (bench_summary.json's content)."""
    return {name: make(doc) for name, make in BLOCKS.items()}


def rewrite(text: str, made: dict[str, str], where: str = "text") -> str:
    """`text` with each marked block's body replaced by `made[name]` (a blank line either side).

    Raises:
        SystemExit: a block name `made` lacks, or an opening marker without its closing one.
    """
    found = _BLOCK.findall(text)
    if text.count("<!-- bench:") != len(found):
        raise SystemExit(f"{where}: a `<!-- bench:NAME -->` marker has no `<!-- /bench -->` after it")
    unknown = [name for name, _ in found if name not in made]
    if unknown:
        raise SystemExit(f"{where}: unknown block(s) {', '.join(unknown)}; known: {', '.join(made)}")
    return _BLOCK.sub(lambda m: f"<!-- bench:{m['name']} -->\n\n{made[m['name']].strip()}\n\n<!-- /bench -->", text)


def publish(results: Path, repo: Path = REPO, check: bool = False) -> list[Path]:
    """Rewrite (or with `check` only compare) the marked blocks of TARGETS from results/bench_summary.json; returns
    the pages that changed (or differ)."""
    doc = json.loads((results / SUMMARY).read_text())
    made = blocks(doc)
    changed = []
    for rel in TARGETS:
        path = repo / rel
        if not path.exists():
            continue
        text = path.read_text()
        new = rewrite(text, made, rel)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new)
    return changed


def main(results: Path, check: bool = False) -> int:
    """`report.py --publish` / `--check`."""
    changed = publish(results, check=check)
    verb = "differs from" if check else "rewritten from"
    for path in changed:
        print(f"{path.relative_to(REPO)}: {verb} {results / SUMMARY}")
    if not changed:
        print(f"the marked blocks of {', '.join(TARGETS)} match {results / SUMMARY}")
    return 1 if check and changed else 0
