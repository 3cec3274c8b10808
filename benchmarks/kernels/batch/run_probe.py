"""Build batch_probe.cu with nvcc, run it on one GPU (under 2 minutes), print its tables and the budget recomputed
with what it measured (issue 38; docs/design/batch.md, "The probe", says what each table decides).

    python benchmarks/kernels/batch/run_probe.py --out "$OUT"          # on the device, from the repository root
    python benchmarks/kernels/batch/run_probe.py --tables FILE.jsonl   # the tables again from a run's JSON lines

Each part (round, mcast, dsmem, mma) runs in its own process with a time limit, so a watchdog trap in one costs
that part only. Writes `batch_probe.jsonl` (the raw lines), `ptxas.txt` and `tables.md` under --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("round", "mcast", "dsmem", "mma")
NVCC = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v"]


def build(out: Path) -> Path:
    """Compile the probe for sm_90a into `out`; the ptxas report (registers, spills) goes to out/ptxas.txt."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("run_probe.py: nvcc is not on PATH (the probe is built with the CUDA toolkit's nvcc)")
    binary = out / "batch_probe"
    res = subprocess.run([nvcc, *NVCC, "-o", str(binary), str(HERE / "batch_probe.cu")], capture_output=True,
                         text=True)  # fmt: skip
    (out / "ptxas.txt").write_text(res.stderr)
    if res.returncode:
        raise SystemExit(f"run_probe.py: nvcc failed\n{res.stderr}")
    return binary


def run(binary: Path, parts: list[str], limit: float) -> list[str]:
    """Each part in its own process (at most `limit` seconds); its JSON lines, and a line for a part that failed."""
    lines: list[str] = []
    for part in parts:
        try:
            res = subprocess.run([str(binary), part], capture_output=True, text=True, timeout=limit)
            got = res.stdout.splitlines()
            if res.returncode:
                got.append(json.dumps({"failed": part, "rc": res.returncode, "stderr": res.stderr[-2000:]}))
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            got = [*out.splitlines(), json.dumps({"failed": part, "rc": "timeout", "limit_s": limit})]
        for line in got:
            print(line, flush=True)
        lines += got
    return lines


def parse(lines: list[str]) -> list[dict]:
    """The JSON objects among the probe's output lines (anything else, a watchdog's message, is skipped)."""
    rows = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def tables(rows: list[dict]) -> str:
    """Markdown tables, one per part; cycles are per round (or per product) of one CTA, averaged over CTAs."""
    out: list[str] = []
    dev = [r for r in rows if "device" in r]
    if dev:
        out.append(f"Device: {dev[0]['device']}, {dev[0]['sms']} SMs, L2 {dev[0]['l2_bytes'] / 2**20:.0f} MiB.")
    kinds = ("round", "bcast", "bcast-noconsume")
    bc = {(r["probe"], r["ctas"], r["bytes"]): r for r in rows if r.get("probe") in kinds}
    sizes = sorted({k[2] for k in bc})
    sms = max((k[1] for k in bc), default=0)
    if sizes:
        out += ["", "**1. Exchange round and broadcast read** (every CTA copies the whole activation from L2 through a "
                "4 x 32-KB ring; cycles a round, mean over CTAs / the slowest)", ""]  # fmt: skip
        body = []
        for b in sizes:

            def cell(kind, ctas, b=b):
                r = bc.get((kind, ctas, b))
                return f"{r['cycles']:,.0f} / {r['cycles_max']:,.0f}" if r else "-"

            r = bc.get(("bcast", sms, b))
            rd = bc.get(("round", sms, b))
            body.append([f"{b // 1024} KB", cell("round", sms), cell("round", 128), cell("round", 32),
                         cell("bcast", sms), cell("bcast-noconsume", sms),
                         f"{r['bytes_per_clk_per_sm']:.1f}" if r else "-",
                         f"{rd['cycles'] - r['cycles']:,.0f}" if r and rd else "-",
                         f"{r['ghz']:.2f}" if r else "-"])  # fmt: skip
        out += _table(["activation", f"round, {sms} CTAs", "round, 128", "round, 32", f"read alone, {sms}",
                       "read, not consumed", "B/clk/SM (read)", "round - read", "GHz"], body)  # fmt: skip
    part = [r for r in rows if r.get("probe") in ("rows", "rows-round", "distinct")]
    if part:
        out += ["", "**2. Row blocks (2-D) and distinct regions** (every CTA reads its own share)", ""]
        out += _table(["probe", "groups", "bytes a CTA", "cycles (mean / max)", "B/clk/SM"],
                      [[r["probe"], r["groups"], f"{r['bytes'] // 1024} KB",
                        f"{r['cycles']:,.0f} / {r['cycles_max']:,.0f}", f"{r['bytes_per_clk_per_sm']:.1f}"]
                       for r in part])  # fmt: skip
    mc = [r for r in rows if r.get("probe") == "mcast"]
    if mc:
        out += ["", "**3. TMA multicast in clusters** (each CTA fetches 1/S of every chunk; vs. the read alone at "
                "the same size)", ""]  # fmt: skip
        body = []
        for r in mc:
            ref = bc.get(("round" if r["barrier"] else "bcast", sms, r["bytes"]))
            body.append([r["cluster"], r["ctas"], f"{r['bytes'] // 1024} KB", "yes" if r["barrier"] else "no",
                         f"{r['cycles']:,.0f} / {r['cycles_max']:,.0f}", f"{r['bytes_per_clk_per_sm']:.1f}",
                         f"{ref['cycles'] / r['cycles']:.2f}x" if ref else "-"])  # fmt: skip
        out += _table(["S", "CTAs", "activation", "grid round", "cycles (mean / max)", "B/clk/SM",
                       "speed-up over every CTA reading L2"], body)  # fmt: skip
    ds = [r for r in rows if r.get("probe") == "dsmem"]
    if ds:
        out += ["", "**4. DSMEM reduction of fp32 partials in a cluster** (bulk copies onto the receiver's "
                "mbarrier, then the fixed-order sum)", ""]  # fmt: skip
        out += _table(["op", "S", "partial", "inbound a CTA", "cycles (mean / max)", "inbound B/clk"],
                      [[r["op"], r["cluster"], f"{r['bytes'] // 1024} KB", f"{r['inbound'] // 1024} KB",
                        f"{r['cycles']:,.0f} / {r['cycles_max']:,.0f}", f"{r['inbound_bytes_per_clk']:.1f}"]
                       for r in ds])  # fmt: skip
    mm = [r for r in rows if r.get("probe") == "mma"]
    if mm:
        out += ["", "**5. mma.sync tile loops from shared memory** (out[R x N] += A[R x K] W[N x K]^T, 8 warps; "
                "peak 1,330 FMA/clk/SM, fused-v2.md 0; shared memory 128 B/clk)", ""]  # fmt: skip
        out += _table(["shape", "R", "N", "K", "warp tile", "cycles", "FMA/clk/SM", "of peak", "smem B/clk"],
                      [[r["what"], r["R"], r["N"], r["K"], f"{r['MT']}x{r['NT']}", f"{r['cycles']:,.0f}",
                        f"{r['fma_per_clk_per_sm']:,.0f}", f"{r['fma_per_clk_per_sm'] / 1330:.0%}",
                        f"{r['smem_bytes_per_clk']:.0f}"] for r in mm])  # fmt: skip
    bad = [r for r in rows if "failed" in r]
    if bad:
        out += ["", "**Failed parts**: " + "; ".join(f"{r['failed']} (rc {r['rc']})" for r in bad)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for batch_probe.jsonl, ptxas.txt, tables.md (default: a temporary one)")
    ap.add_argument("--only", default=",".join(PARTS), help=f"parts to run, of {','.join(PARTS)}")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds a part may run")
    ap.add_argument("--tables", help="print the tables of an earlier run's JSON lines and exit")
    args = ap.parse_args()
    if args.tables:
        lines = Path(args.tables).read_text().splitlines()
    else:
        parts = [p for p in args.only.split(",") if p]
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise SystemExit(f"run_probe.py: --only {','.join(unknown)}: not a part (parts: {', '.join(PARTS)})")
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="batch_probe_"))
        out.mkdir(parents=True, exist_ok=True)
        lines = run(build(out), parts, args.limit)
        (out / "batch_probe.jsonl").write_text("\n".join(lines) + "\n")
    text = tables(parse(lines))
    print("\n" + text)
    sys.path.insert(0, str(HERE))
    import budget  # the model beside this file

    costs = budget.load_probe(lines)
    summary = budget.summary(costs)
    print("\nBudget with these constants:", costs, "\n" + summary, sep="\n")
    if not args.tables:
        (out / "tables.md").write_text(text + "\n\n" + str(costs) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
