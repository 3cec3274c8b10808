"""The cycle and byte budget of a persistent MLP step at batch 64-512, per partition (issue 38, written before any
kernel; docs/design/batch.md explains every line).

    python benchmarks/kernels/batch/budget.py                      # us/step, every h x batch x partition
    python benchmarks/kernels/batch/budget.py --h 1024 --batch 512  # one case, phase by phase, every partition
    python benchmarks/kernels/batch/budget.py --probe OUT/batch_probe.jsonl  # with the probe's constants

The model, for 784-h-h-h-10, "mixed", SGD, one CTA per SM: each phase of the batch-32 grid kernel (its measured
cycles, docs/design/grid-engine.md) keeps its latency chain, and adds the throughput work that grows with the batch:
the bytes a CTA receives from L2 (or HBM, or a peer's shared memory), the bytes it reads from its own shared memory,
and its tensor-core multiply-adds, whichever bounds (a bulk-copy ring overlaps them). A phase costs

    latency (the batch-32 phase measured, less the batch-32 throughput term the model gives it) + throughput(B)

so every partition reproduces the measured batch-32 step by construction at B = 32 (1-D) and differs from it only by
measured rates times counted bytes and multiply-adds. Constants carry their source (a section of grid.md,
fused-v2.md or grid-engine.md) or say "estimate"; `--probe` replaces the estimates with batch_probe.cu's numbers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace

#: Batch-32 phases of the grid kernels as measured on an H100 (docs/design/grid-engine.md: "Phase profile at this
#: release", call A, grid_fast.cu at h = 256 / 1024; "Phase profile at h = 4096", grid_stream.cu, SGD), cycles a
#: step of CTA 0, grouped as this model's phases (the round's wait lands in the phase after it).
MEASURED_B32 = {
    256: {"B0+F0": 340 + 3619, "R1+F1": 2211 + 2603, "R2+F2": 2086 + 475, "R3+head": 2436 + 1668,
          "dZ2+B2": 2017, "R5+B1": 1754 + 1041 + 974},
    1024: {"B0+F0": 483 + 3604, "R1+F1": 3672 + 1849, "R2+F2": 3785 + 887, "R3+head": 3129 + 2053,
           "dZ2+B2": 4451, "R5+B1": 3688 + 1612 + 2665},
    4096: {"B0+F0": 354 + 18319, "R1+F1": 9150 + 22621, "R2+F2": 6815 + 25020, "R3+head": 5707 + 12221,
           "dZ2+B2": 95486, "R5+B1": 3276 + 5485 + 101581},
}  # fmt: skip
PHASES = ("B0+F0", "R1+F1", "R2+F2", "R3+head", "dZ2+B2", "R5+B1")
#: Phases that open with a grid-wide round (barrier + the exchanged activation).
ROUND_PHASES = ("R1+F1", "R2+F2", "R3+head", "R5+B1")

#: us/step of the issue's table (issue 38: H200 at batch 128 / 512, H100 at 64 / 256; JAX = the best of default
#: precision and fp16), and at batch 32 the release's one-call H100 measurement (grid-engine.md, "Against JAX").
#: None: not measured (benchmarks/final.py calls 8 and 9 measure the batch grid, h = 4096 included).
JAX = {
    (256, 32): 41.07, (1024, 32): 52.45, (4096, 32): 269.92,
    (256, 64): 48.3, (1024, 64): 66.3, (256, 128): 55.0, (1024, 128): 89.5,
    (256, 256): 64.7, (1024, 256): 118.2, (256, 512): 77.5, (1024, 512): 161.4,
}  # fmt: skip
GRAPH = {
    (256, 32): 42.13, (1024, 32): 62.31, (4096, 32): 302.07,
    (256, 64): 44.5, (1024, 64): 66.4, (256, 128): 53.0, (1024, 128): 72.6,
    (256, 256): 52.8, (1024, 256): 83.9, (256, 512): 72.2, (1024, 512): 101.2,
}  # fmt: skip
#: Issue 38's targets: the ratio to JAX at each batch (h <= 1024), and at h = 2048-4096.
TARGET = {64: 3.0, 128: 3.0, 256: 3.0, 512: 2.5}
TARGET_WIDE = 1.6


@dataclass(frozen=True)
class Costs:
    """Measured hardware rates (H100) and the model's estimates; the probe overrides the estimates."""

    ghz: float = 1.75  #: SM clock under a persistent kernel's load (grid.md 1: 1.70-1.84 GHz)
    sms: int = 132
    #: a round's fixed part in a real step: the counter barrier (grid.md 1: 994-1,003 ns at 128-132 CTAs) with the
    #: skew between CTAs (grid.md 1: 1.05-1.5x); the copy is counted apart, at l2_bcast
    round_fixed: float = 2000.0
    #: bytes a cycle one SM receives when every CTA bulk-copies the same data from L2 (grid.md 1: 64 KB at 128 CTAs
    #: in 597 ns = 57 B/clk/SM)
    l2_bcast: float = 57.0
    #: bytes a cycle an SM receives with TMA multicast in clusters of S (each CTA fetching 1/S): ESTIMATE (= the
    #: L2 broadcast: the SM's inbound port, not L2, assumed to bind); the probe's "mcast" rows replace it
    mcast: dict = field(default_factory=lambda: {2: 57.0, 4: 57.0, 8: 57.0})
    smem: float = 128.0  #: shared-memory bytes a cycle an SM (fused-v2.md 0)
    mma_peak: float = 1330.0  #: mma.sync m16n8k16 dense FMA a cycle an SM, >= 2 chains a warp (fused-v2.md 0)
    #: the share of mma_peak a CTA's tile loop reaches with ldmatrix operands: ESTIMATE; the probe's "mma" rows
    #: replace it per shape (the 8-unit 1-D tiles are bounded by shared memory instead, counted apart)
    mma_eff: float = 0.6
    dsmem_lat: float = 680.0  #: a DSMEM bulk-copy round's latency (fused-v2.md 0)
    dsmem_rate: float = 21.0  #: DSMEM bytes a cycle into one CTA (fused-v2.md 0: 15-23; S = 2..4 at 16 KB ~21)
    hbm: float = 2.95e12  #: bytes a second (grid.md 1: 2.88 copy, 2.98 read; grid-engine.md 4096: 3.0-3.2 per pass)

    def cyc(self, us: float) -> float:
        return us * self.ghz * 1e3

    def us(self, cycles: float) -> float:
        return cycles / (self.ghz * 1e3)


@dataclass(frozen=True)
class Partition:
    """How a step is spread: `pu` unit blocks of `nb` units x `pb` row blocks of `rows` rows (P = pu * pb CTAs);
    `share` = how the activations reach a CTA: "l2" (every CTA copies its rows from L2), "mcast" (TMA multicast
    in clusters of `s`), and `reduce` = how the weight gradients of a unit block's `pb` row blocks are summed:
    "" (none: 1-D), "dsmem" (inside a cluster of pb), "l2" (written, one more round, read back)."""

    name: str
    pu: int
    nb: int
    pb: int
    rows: int
    share: str = "l2"
    s: int = 1
    reduce: str = ""
    masters: str = "chip"  #: "chip" (registers + shared memory), "l2" (L2-resident scratch), "hbm" (h > 1024)
    head: str = "redundant"  #: "redundant" (every CTA, all h: grid.md 2.1) or "split" (own units: grid.md 4.2)

    @property
    def ctas(self) -> int:
        return self.pu * self.pb


@dataclass
class Phase:
    """One phase's work for one CTA (bytes and multiply-adds) and its cycles."""

    name: str
    l2: float = 0.0  #: bytes received from L2 (activations, the batch, weight rows, masters in L2 or HBM)
    hbm: float = 0.0  #: bytes the whole GPU moves to or from HBM in this phase (streamed masters)
    smem: float = 0.0  #: bytes read from the CTA's own shared memory by ldmatrix / loads
    fma: float = 0.0  #: tensor-core multiply-adds (padded tiles counted)
    dsmem: float = 0.0  #: bytes received from peers' shared memory
    extra_rounds: int = 0  #: grid-wide rounds beyond the batch-32 kernel's in this phase
    latency: float = 0.0  #: the batch-32 chain (measured phase less its modelled batch-32 throughput)
    cycles: float = 0.0
    bound: str = ""


def partitions(h: int, batch: int, costs: Costs = Costs()) -> list[Partition]:
    """The candidates issue 38 names, each at the shapes that fit the GPU: 1-D (today's), 1-D with multicast in
    clusters of 2/4/8, 2-D units x rows with the reduction in a cluster (DSMEM), batch split with the reduction
    through L2; each with the redundant head and with the split one."""
    hbm = h > 1024
    nb1 = 8 if not hbm else h // 128  # grid_fast.cu: h / 8 CTAs; grid_stream.cu: 128 CTAs
    base = [Partition("1-D", h // nb1, nb1, 1, batch, masters="hbm" if hbm else "chip")]
    for s in (2, 4, 8):
        base.append(replace(base[0], name=f"1-D mcast S={s}", share="mcast", s=s))
    for pb in (2, 4, 8):
        if batch % (16 * pb):
            continue
        nb = max(8, -(-h * pb // 128) // 8 * 8)  # the fewest units a CTA that keep pu * pb within 128 CTAs
        while h % nb:
            nb += 8
        pu = h // nb
        if pu * pb > costs.sms:
            continue
        for red, label in (("dsmem", f"2-D x{pb} (DSMEM)"), ("l2", f"split x{pb} (L2)")):
            p = Partition(label, pu, nb, pb, batch // pb, reduce=red, masters="hbm" if hbm else "chip")
            if not fits_on_chip(h, p):
                p = replace(p, masters="l2")
            base.append(p)
    return [q for p in base for q in (p, replace(p, name=p.name + ", split head", head="split"))]


def _phases(h: int, batch: int, p: Partition, costs: Costs) -> list[Phase]:
    """The six phases' work for one CTA of `p` (no cycles yet)."""
    d, c16, r, nb = 784, 16, p.rows, p.nb
    act = r * h * 2  # one exchanged activation's rows, fp16
    # masters off chip: a DSMEM reduce-scatter splits each block over its pb CTAs; the L2 all-reduce replicates it
    msplit, mcopies = (p.pb, 1) if p.reduce == "dsmem" else (1, p.pb)
    out = []
    # B0(s-1) + F0(s): the CTA's rows of the batch (uint8), W0's update and forward over its nb units
    ph = Phase("B0+F0", l2=r * d, smem=2 * r * d, fma=2 * r * d * max(nb, 16))
    if p.masters != "chip":
        ph.l2 += 4 * nb * d / msplit  # this CTA's share of W0's masters, read through its L2 port
    if p.masters == "hbm":
        ph.hbm = 8 * h * d * mcopies  # W0's master read and written (grid-engine.md: 8 B a parameter)
    out.append(ph)
    for name in ("R1+F1", "R2+F2"):  # the round, then Z = H W[U, :]^T over the CTA's rows and units
        ph = Phase(name, l2=act + 2 * nb * h, smem=act * max(1, 8 // nb) + 2 * nb * h, fma=r * h * max(nb, 8))
        if p.masters == "hbm":
            ph.hbm = 2 * h * h  # the fp16 rows of W1 / W2 (2 B a parameter), read once GPU-wide
        out.append(ph)
    if p.head == "redundant":
        # R3 + head: every CTA computes logits, softmax and dZ2 for its rows and all h units (grid.md 2.1)
        out.append(Phase("R3+head", l2=act + 2 * 2 * c16 * h, smem=2 * act, fma=2 * c16 * r * h))
    else:
        # split head (grid.md 4.2, with a row-wise reduction instead of atomics): partial logits over the CTA's own
        # units, a round to sum them by rows (each CTA reads its r / pu rows' partials from the pu unit blocks),
        # softmax there, a round to share dlogits; dZ2[:, U] local: two rounds where the redundant head had one
        out.append(Phase("R3+head", l2=r * c16 * 4 + r * c16 * 2 + 2 * c16 * nb, smem=r * c16 * 8,
                         fma=2 * c16 * r * max(nb, 8), extra_rounds=1))  # fmt: skip
    # dZ2 + B2: dgrad dZ1[:, U] = dZ2 W2[:, U] and W2's weight gradient and update (local in 1-D); with the split
    # head, dZ2 (all units) comes by a round of its own, the bytes H2's round carried before
    # masters off chip: the column block's share read (written back: outbound); in HBM 10 B a parameter move
    # (master read + write, fp16 row copy written; grid-engine.md: 12 B with the forward's 2)
    wb_l2 = 4 * h * nb / msplit if p.masters != "chip" else 0.0
    wb_hbm = 10 * h * h * mcopies if p.masters == "hbm" else 0.0
    ph = Phase("dZ2+B2", l2=wb_l2, hbm=wb_hbm, smem=2 * act, fma=2 * r * h * max(nb, 8))
    if p.head == "split":
        ph.l2 += act
        ph.extra_rounds = 1
    out.append(ph)
    # R5 + B1: the dZ1 round, then W1's dgrad, weight gradient and update
    out.append(Phase("R5+B1", l2=act + wb_l2, hbm=wb_hbm, smem=2 * act, fma=2 * r * h * max(nb, 8)))
    if p.reduce:
        blk = nb * (d + 2 * h)  # the weight gradients of W0's rows and W1's and W2's column blocks
        if p.reduce == "dsmem":
            # summed over the pb row blocks inside the cluster: reduce-scatter in fp32 (each CTA updates 1/pb of
            # the block's masters), then the updated fp16 block gathered back (the forward and dgrad need it whole)
            out.append(Phase("reduce", dsmem=6 * blk * (p.pb - 1) / p.pb, smem=4 * blk))
        else:
            # through L2: every CTA writes its fp32 partial, one more round, reads its pb - 1 partners' partials and
            # sums all pb in rank order (replicated masters stay bit-identical: no second round for a gather)
            out.append(Phase("reduce", l2=4 * blk * (p.pb - 1), smem=4 * blk * p.pb, extra_rounds=1))
    return out


def _throughput(ph: Phase, p: Partition, costs: Costs) -> tuple[float, str]:
    """The cycles the phase's bytes and multiply-adds need at the measured rates, and what bounds them."""
    inbound = costs.mcast[p.s] if p.share == "mcast" else costs.l2_bcast
    terms = {
        "L2": ph.l2 / inbound,
        "smem": ph.smem / costs.smem,
        "mma": ph.fma / (costs.mma_peak * costs.mma_eff),
        "HBM": ph.hbm / (costs.hbm / (costs.ghz * 1e9)),
        # two DSMEM exchanges (reduce-scatter, gather) for each of three layers' blocks
        "DSMEM": (costs.dsmem_lat * 6 + ph.dsmem / costs.dsmem_rate) if ph.dsmem else 0.0,
    }
    bound = max(terms, key=terms.get)
    return terms[bound], bound


def budget(h: int, batch: int, p: Partition, costs: Costs = Costs()) -> list[Phase]:
    """Each phase of `p` at (h, batch) with its cycles: the measured batch-32 latency chain + throughput(batch)."""
    ref = MEASURED_B32[h]
    base = {ph.name: ph for ph in _phases(h, 32, partitions(h, 32, costs)[0], costs)}
    one_d = partitions(h, 32, costs)[0]
    out = []
    for ph in _phases(h, batch, p, costs):
        ph.latency = costs.round_fixed * ph.extra_rounds
        if ph.name in ref:  # the chain measured at batch 32, less what the model says its bytes and FMA took
            t32, _ = _throughput(base[ph.name], one_d, costs)
            ph.latency += max(ref[ph.name] - t32, 0.0)
        t, ph.bound = _throughput(ph, p, costs)
        ph.cycles = ph.latency + t
        out.append(ph)
    return out


def step_us(h: int, batch: int, p: Partition, costs: Costs = Costs()) -> float:
    return costs.us(sum(ph.cycles for ph in budget(h, batch, p, costs)))


def fits_on_chip(h: int, p: Partition) -> bool:
    """Whether the CTA's masters (fp32, split 1/pb by a DSMEM reduce-scatter) and its fp16 block fit beside a 4-stage
    ring of 32 KB: shared memory (227 KB) + ~64 KB of registers (where not, the plan keeps them in L2)."""
    if p.masters != "chip":
        return True
    split = p.pb if p.reduce == "dsmem" else 1  # the reduce-scatter splits the masters; the L2 all-reduce does not
    masters = 4 * p.nb * (784 + 2 * h) / split + (2 * p.nb * (784 + 2 * h) if split > 1 else 0)  # + the fp16 block
    return masters + 4 * 32768 <= 227 * 1024 + 64 * 1024  # the batch's rows stream through the ring too


def load_probe(lines: list[str], costs: Costs = Costs()) -> Costs:
    """Costs with the probe's measurements (batch_probe.cu's JSON lines) in place of the estimates and the
    batch-32 constants it re-measures: clock, L2 broadcast rate, multicast rate per cluster size, DSMEM rate,
    the mma efficiency of the tile loops (the median of the shapes with >= 32 units)."""
    rows = [json.loads(s) for s in lines if s.strip().startswith("{")]
    out = costs
    big = [r for r in rows if r.get("probe") == "bcast" and r["bytes"] >= 256 << 10]
    if big:
        out = replace(out, l2_bcast=sum(r["bytes_per_clk_per_sm"] for r in big) / len(big),
                      ghz=sum(r["ghz"] for r in big) / len(big))  # fmt: skip
    mc = {}
    for r in rows:
        if r.get("probe") == "mcast" and not r["barrier"] and r["bytes"] >= 256 << 10:
            mc.setdefault(r["cluster"], []).append(r["bytes_per_clk_per_sm"])
    if mc:
        out = replace(out, mcast={**out.mcast, **{s: sum(v) / len(v) for s, v in mc.items()}})
    ds = [r["inbound_bytes_per_clk"] for r in rows if r.get("probe") == "dsmem" and r["inbound"] >= 16 << 10]
    if ds:
        out = replace(out, dsmem_rate=sorted(ds)[len(ds) // 2])
    mm = sorted(r["fma_per_clk_per_sm"] for r in rows if r.get("probe") == "mma" and r["N"] >= 32)
    if mm:
        out = replace(out, mma_eff=mm[len(mm) // 2] / out.mma_peak)
    rd = [r for r in rows if r.get("probe") == "round" and r["ctas"] >= 128 and r["bytes"] <= 32 << 10]
    if rd:
        # the micro's barrier at 16-32 KB less its copy, times the skew a real step adds (grid.md 1: 1.05-1.5x)
        out = replace(out, round_fixed=min(r["cycles"] - r["bytes"] / out.l2_bcast for r in rd) * 1.2)
    return out


def override(costs: Costs, pairs: list[str]) -> Costs:
    """Costs with NAME=VALUE pairs applied (mcast=V sets every cluster size); a bad name or value is refused."""
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in Costs.__dataclass_fields__ or not value:
            names = ", ".join(Costs.__dataclass_fields__)
            raise SystemExit(f"--set {pair!r}: expected NAME=VALUE with NAME one of {names}")
        try:
            v = float(value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {value!r} is not a number") from None
        new = {s: v for s in costs.mcast} if name == "mcast" else type(getattr(costs, name))(v)
        costs = replace(costs, **{name: new})
    return costs


def summary(costs: Costs, widths=(256, 1024, 4096), batches=(64, 128, 256, 512)) -> str:
    """Markdown: us/step per partition (its best shape), the best, JAX and the graph engine where measured."""
    lines = ["| h | batch | " + " | ".join(("1-D", "1-D mcast (best S)", "2-D DSMEM (best Pb)", "split L2 (best G)"))
             + " | best | JAX | graph | target us | best vs JAX |",
             "|---:|---:|" + "---:|" * 4 + "---|---:|---:|---:|---:|"]  # fmt: skip
    for h in widths:
        for b in batches:
            best: dict[str, tuple[float, str]] = {}
            for p in partitions(h, b, costs):
                if not fits_on_chip(h, p):
                    continue
                fam = p.name.split(",")[0].split(" x")[0].split(" S=")[0]
                t = step_us(h, b, p, costs)
                if fam not in best or t < best[fam][0]:
                    best[fam] = (t, p.name)
            cells = []
            for fam in ("1-D", "1-D mcast", "2-D", "split"):
                t, name = best.get(fam, (float("nan"), "-"))
                tag = name[len(fam) :].strip(" ,").replace(" (DSMEM)", "").replace(" (L2)", "") if name != "-" else ""
                cells.append(f"{t:.1f}" + (f" ({tag})" if tag else ""))
            win = min(best.values(), key=lambda v: v[0])  # ties: the simpler partition (listed first)
            jax, graph = JAX.get((h, b)), GRAPH.get((h, b))
            target = (jax / (TARGET[b] if h <= 1024 else TARGET_WIDE)) if jax else None
            lines.append(f"| {h} | {b} | " + " | ".join(cells) + f" | {win[1]} | {jax or 'n/m'} | {graph or 'n/m'} | "
                         + (f"{target:.1f}" if target else "-") + " | "
                         + (f"{jax / win[0]:.2f}x" if jax else "-") + " |")  # fmt: skip
    return "\n".join(lines)


def detail(h: int, batch: int, costs: Costs, only: tuple[str, ...] = ()) -> str:
    """Markdown: each partition's phases at (h, batch) (those named in `only`, if given): cycles, the bound,
    bytes and multiply-adds per CTA."""
    out = []
    for p in partitions(h, batch, costs):
        if only and p.name not in only:
            continue
        phs = budget(h, batch, p, costs)
        total = sum(ph.cycles for ph in phs)
        fit = {"chip": "masters on chip", "l2": "masters in L2 (they do not fit on chip)", "hbm": "masters in HBM"}[
            p.masters
        ]
        out.append(f"\n{p.name}: {p.ctas} CTAs = {p.pu} unit blocks of {p.nb} x {p.pb} row blocks of {p.rows}, {fit}"
                   f"; {total:,.0f} cycles = {costs.us(total):.1f} us")  # fmt: skip
        out.append("| phase | latency | throughput | bound | L2 KB | smem KB | DSMEM KB | HBM MB (GPU) | MFMA |")
        out.append("|---|---:|---:|---|---:|---:|---:|---:|---:|")
        for ph in phs:
            out.append(f"| {ph.name} | {ph.latency:,.0f} | {ph.cycles - ph.latency:,.0f} | {ph.bound} | "
                       f"{ph.l2 / 1024:,.0f} | {ph.smem / 1024:,.0f} | {ph.dsmem / 1024:,.0f} | {ph.hbm / 1e6:,.1f} | "
                       f"{ph.fma / 1e6:,.2f} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h", type=int, help="one width: print every partition's phases (with --batch)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--probe", help="batch_probe.cu's JSON lines (run_probe.py --out): replaces the estimates")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a constant, e.g. --set mma_eff=0.8 --set mcast=114 (every cluster size)",
    )
    ap.add_argument("--only", default="", help='partitions to detail, ";"-separated names, e.g. "1-D;split x2 (L2)"')
    args = ap.parse_args()
    costs = Costs()
    if args.probe:
        with open(args.probe) as f:
            costs = load_probe(f.readlines(), costs)
    costs = override(costs, args.set)
    print("constants:", costs)
    only = tuple(n.strip() for n in args.only.split(";") if n.strip())
    print(detail(args.h, args.batch, costs, only) if args.h else summary(costs))


if __name__ == "__main__":
    main()
