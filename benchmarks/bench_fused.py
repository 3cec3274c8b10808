"""The persistent engines (fused, grid) against the graph engine: us/step, first-fit setup and test accuracy.

    python benchmarks/bench_fused.py --data DIR [--only logreg,mlp128,sweep] [--precision mixed] [--momentum M]
        [--optimizer sgd|adamw] [--widths 256,1024] [--batch 32] [--engines graph,fused,grid,fused-lean,fused-fma]
        [--json F]

Both engines train the same model from the same weights in the same order in one process. Training time is
the sum of the per-epoch device-event times of a second `fit` (the captured epoch replayed); setup is the
first `fit` of a fresh trainer (one epoch, kernel cache as found). "sweep" runs 784-h-h-h-10 (batch 32)
for h in 32..1024 to find the width where the fused engine stops winning (engine="auto"'s rule).
"fused-lean" is the fused engine held to its lean shared-memory layout (no fp16 weight copy, momentum holding
the gradient), which it takes by itself only where the standard layout does not fit: its cost, measured;
"fused-fma" computes the products with scalar FMA instead of tensor cores ("fused-lean-fma": both).
"grid" is engine="grid" (one cooperative kernel over every SM); --widths replaces the sweep's widths (up to 8192:
wide models train `samples` rows for one epoch) and --batch its batch size.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import fastnn
from fastnn.engine import Tuning

WORKLOADS = {
    # name: (sizes, lr, batch, epochs, samples)
    "logreg": ([784, 10], 0.1, 128, 20, 60000),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32, 5, 32000),
    "mlp256": ([784, 256, 256, 256, 10], 0.003, 32, 5, 32000),  # held in the lean layout only (4 rows a chunk)
}
SWEEP = [32, 64, 96, 128, 192, 256, 384, 512, 1024]


def tuning_of(engine: str, phases: bool = False) -> Tuning:
    """The Tuning an --engines entry names: "-lean" holds the fused engine to its lean layout, "-fma" computes the
    products with scalar FMA; phases: the fused kernel prints its phase
    timing (-DFUSED_PROFILE), the grid kernel keeps its own (-DGRID_PROFILE), which `grid_phases` reads back."""
    return Tuning(
        fused_layouts=("lean",) if "-lean" in engine else Tuning().fused_layouts,
        tensor_cores="-fma" not in engine,
        fused_profile=phases,
        grid_profile=phases,
    )


def grid_phases(t: fastnn.Trainer) -> dict[str, float] | None:
    """The grid kernel's phase profile of the last epoch (Tuning(grid_profile=True)): CTA 0's cycles per step of
    each phase of the kernel that ran (grid_fast.cu or grid_stream.cu), or None for another engine or the
    graph step."""
    ctx = t._engine.train_context if t.engine == "grid" else None
    if ctx is None or not hasattr(ctx, "phase_cycles"):
        return None
    names = ctx.phase_names()
    cycles = ctx.phase_cycles()
    steps = max(int(cycles[len(names)]), 1)
    return {name: float(cycles[i]) / steps for i, name in enumerate(names)}


def run(sizes, lr, batch, epochs, samples, data, precision: str, engine: str, momentum: float = 0.0,
        phases: bool = False, optimizer: str = "sgd") -> dict:  # fmt: skip
    x, y, xt, yt = data
    x, y = x[:samples], y[:samples]
    opt = fastnn.AdamW(lr=lr / 10) if optimizer == "adamw" else fastnn.SGD(lr=lr, momentum=momentum)
    try:
        t = fastnn.Trainer(fastnn.MLP(sizes), optimizer=opt, batch_size=batch,
                           precision=precision, device="cuda", seed=0, engine=engine.split("-")[0],
                           tuning=tuning_of(engine, phases))  # fmt: skip
    except fastnn.ConfigError as exc:
        return {"sizes": sizes, "engine": engine, "refused": str(exc)}
    try:
        row = _timed(t, x, y, xt, yt, epochs, batch) | {
            "sizes": sizes,
            "engine": engine,
            "precision": precision,
            "momentum": momentum,
            "optimizer": optimizer,
        }
        if phases and (profile := grid_phases(t)) is not None:
            row["phases_cycles_per_step"] = profile
            print("  grid phases (cycles a step, CTA 0): "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in profile.items()), flush=True)  # fmt: skip
        return row
    finally:
        t.close()


def _timed(t: fastnn.Trainer, x, y, xt, yt, epochs: int, batch: int) -> dict:
    t0 = time.perf_counter()
    t.fit(x, y, epochs=1, progress=False)
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    h = t.fit(x, y, epochs=epochs, progress=False)
    wall = time.perf_counter() - t1
    device = float(np.sum(h["seconds"]))
    steps = epochs * -(-len(x) // batch)
    acc = t.evaluate(xt, yt)["accuracy"]
    return {"batch": batch, "steps": steps, "device_s": device, "wall_s": wall, "us_per_step": device / steps * 1e6,
            "first_fit_s": setup, "test_accuracy": acc, "final_train_loss": h[-1]["train_loss"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--precision", default="mixed")
    ap.add_argument("--only", default="logreg,mlp128,sweep")
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--engines", default="graph,fused")
    ap.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"), help="adamw: lr / 10")
    ap.add_argument("--widths", default=None, help=f"the sweep's hidden widths (default: {SWEEP})")
    ap.add_argument("--batch", type=int, default=32, help="the sweep's batch size")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--phases",
        action="store_true",
        help="compile the fused and grid kernels with their phase profile (-DFUSED_PROFILE, -DGRID_PROFILE): "
        "the cycles per step of each phase (CTA 0), so the next limit is visible",
    )
    args = ap.parse_args()
    data = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
    jobs = []
    for name in args.only.split(","):
        if name == "sweep":
            widths = [int(w) for w in args.widths.split(",")] if args.widths else SWEEP
            jobs += [([784, h, h, h, 10], 0.003, args.batch, 1, 32000) for h in widths]
        else:
            jobs.append(WORKLOADS[name])
    rows = []
    for prec in args.precision.split(","):
        for job in jobs:
            pair = {}
            for engine in args.engines.split(","):
                r = run(*job, data, prec, engine, args.momentum, args.phases, args.optimizer)
                rows.append(r)
                pair[engine] = r
                if "refused" in r:
                    print(f"{str(job[0]):28s} {engine:10s} refused: {r['refused']}", flush=True)
                    continue
                print(f"{str(job[0]):28s} {engine:10s} {prec:5s} b{job[2]:<4d} {r['us_per_step']:8.2f} us/step  "
                      f"first fit {r['first_fit_s']:.2f} s  acc {r['test_accuracy']:.4f}  "
                      f"loss {r['final_train_loss']:.4f}", flush=True)  # fmt: skip
            base = pair.get("graph", {}).get("us_per_step")
            for engine, r in pair.items():
                if engine != "graph" and base and "us_per_step" in r:
                    print(f"{'':28s} graph/{engine} {base / r['us_per_step']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
