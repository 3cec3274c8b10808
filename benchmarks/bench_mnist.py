"""Benchmark fastnn against PyTorch on Fashion-MNIST (issue 3); benchmarks/README.md says how and what.

    python benchmarks/bench_mnist.py --data DIR [--quick] [--out results/] [--only C,..] [--only-workload W,..]
    python benchmarks/bench_mnist.py --merge --out results/     # partial runs -> bench.json, bench.md, graphs
    python benchmarks/bench_mnist.py --dry-run                  # the plan, on the CPU, without torch

Every (workload, contender) pair gives one row; after each row the run's partial JSON is rewritten under
out/partial/, so a run cut short keeps what it finished, and runs split over several calls merge at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from report import PARTIAL_DIR, write_outputs  # noqa: E402
from workloads import (  # noqa: E402
    LOSS_WORKLOADS,
    SEED,
    Contender,
    Workload,
    environment,
    load_data,
    plan_dict,
    select,
    write_json,
)

#: The dry run trains (a tiny fake epoch on the CPU) only models up to this many parameters; larger: config only.
DRY_FIT_PARAMS = 2_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="Fashion-MNIST IDX files (default: fastnn.datasets' search order)")
    p.add_argument("--out", metavar="DIR", default="results", help="output folder (default: results)")
    p.add_argument("--quick", action="store_true", help="h in 128, 1024; 3 logreg epochs; 1,000 MLP steps")
    p.add_argument("--only", metavar="C[,C..]", help="contenders or groups (fastnn, torch, numpy) to run")
    p.add_argument("--only-workload", metavar="W[,W..]", help="workloads: logreg, mlp-128, .., or mlp (all MLPs)")
    p.add_argument("--skip-compile", action="store_true", help="leave out torch-compile-amp (slow to compile)")
    p.add_argument("--cpu-budget", type=float, default=60.0, metavar="S", help="seconds for numpy-cpu before scaling")
    p.add_argument("--merge", action="store_true", help="only merge out/partial/*.json into the outputs")
    p.add_argument("--no-merge", action="store_true", help="write only this run's partial JSON")
    p.add_argument("--no-plots", action="store_true", help="write no graphs")
    p.add_argument("--dry-run", action="store_true", help="print the plan, build the fastnn trainers on the CPU, exit")
    args = p.parse_args(argv)
    if args.cpu_budget <= 0:
        p.error(f"--cpu-budget must be > 0, got {args.cpu_budget}")
    return args


def _pairs(contenders: list[Contender], workloads: list[Workload]) -> list[tuple[Workload, Contender]]:
    return [(w, c) for w in workloads for c in contenders if not (c.logreg_only and w.name != "logreg")]


def print_plan(contenders: list[Contender], workloads: list[Workload]) -> None:
    print("workloads:")
    for w in workloads:
        sizes = "-".join(map(str, w.sizes))
        print(
            f"  {w.name:9} {sizes:24} lr {w.lr:<6} batch {w.batch_size:<4} samples {w.samples:>6} "
            f"epochs {w.epochs:>2} x {w.steps_per_epoch} steps = {w.steps} steps"
        )
    print("contenders:")
    for c in contenders:
        print(f"  {c.name:18} {c.description}" + (" (logreg only)" if c.logreg_only else ""))
    print(f"pairs: {len(_pairs(contenders, workloads))}")


def dry_run(contenders: list[Contender], workloads: list[Workload]) -> int:
    """Build every fastnn trainer of the plan on the CPU; fit small ones one epoch on tiny fake data."""
    from fastnn_contenders import make_trainer, rewind

    import fastnn
    from fastnn.model import init_parameters

    rng = np.random.default_rng(SEED)
    for w, c in _pairs(contenders, workloads):
        if c.family == "torch":
            continue
        model = fastnn.MLP(w.sizes)
        if model.num_parameters() > DRY_FIT_PARAMS:
            fastnn.SGD(lr=w.lr)
            print(f"  {w.name:9} {c.name:14} config ok ({model.num_parameters():,} parameters: not built on the CPU)")
            continue
        n = 2 * w.batch_size + 3  # a short last batch, as in logreg
        x = rng.integers(0, 256, size=(n, w.sizes[0]), dtype=np.uint8)
        y = rng.integers(0, w.sizes[-1], size=n)
        with make_trainer(c, w, device="cpu") as trainer:
            trainer.fit(x, y, epochs=1)
            rewind(trainer, init_parameters(model, SEED), -(-n // w.batch_size))
            last = trainer.fit(x, y, epochs=1)[-1]
            if not np.isfinite(last["train_loss"]):
                raise SystemExit(f"dry run: {c.name} on {w.name} gave loss {last['train_loss']}")
        print(f"  {w.name:9} {c.name:14} trainer ok on cpu (fake data, loss {last['train_loss']:.4f})")
    print(f"torch imported: {'torch' in sys.modules}")
    return 0


def preflight(contenders: list[Contender]) -> bool:
    """Exit with a clear message when a contender's device or library is missing; True when torch is needed."""
    if any(c.family == "fastnn" for c in contenders):
        from fastnn.device import cuda_status

        usable, reason = cuda_status()
        if not usable:
            raise SystemExit(f"fastnn contenders need a usable GPU: {reason} (or run --only numpy)")
    with_torch = any(c.family == "torch" for c in contenders)
    if with_torch:
        try:
            import torch
        except ImportError:
            raise SystemExit("torch contenders need PyTorch: pip install torch (or --only fastnn,numpy)") from None
        if not torch.cuda.is_available():
            raise SystemExit("torch contenders need torch.cuda.is_available() (or --only fastnn,numpy)")
    return with_torch


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def run_pair(w: Workload, c: Contender, data: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One row's numbers; its family's module is imported only here (torch only for torch rows)."""
    if c.family == "torch":
        from torch_contenders import run_torch

        return run_torch(c, w, data, record_steps=w.name in LOSS_WORKLOADS)
    from fastnn_contenders import run_fastnn

    return run_fastnn(c, w, data, cpu_budget_s=args.cpu_budget)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.merge:
        write_outputs(out, plots=not args.no_plots)
        return 0
    contenders, workloads = select(args.only, args.only_workload, args.skip_compile, args.quick)
    print_plan(contenders, workloads)
    if args.dry_run:
        return dry_run(contenders, workloads)
    with_torch = preflight(contenders)
    data = load_data(args.data)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    pairs = _pairs(contenders, workloads)
    doc: dict[str, Any] = {
        "schema": 1,
        "run": {"run_id": run_id, "started": time.time(), "argv": sys.argv, "args": vars(args), "finished": None},
        "environment": environment(with_torch),
        "workloads": {w.name: plan_dict(w) for w in dict.fromkeys(w for w, _ in pairs)},
        "rows": [],
    }
    path = out / PARTIAL_DIR / f"{run_id}.json"
    print(f"device: {doc['environment'].get('device')}; partial results: {path}")
    failed = 0
    for i, (w, c) in enumerate(pairs, 1):
        row: dict[str, Any] = {
            "workload": w.name,
            "contender": c.name,
            "family": c.family,
            "precision": c.precision,
            "kind": c.kind,
            "description": c.description,
            "hidden": w.hidden,
            "epochs": w.epochs,
            "steps": w.steps,
            "run_id": run_id,
        }
        try:
            row.update(run_pair(w, c, data, args))
            row.update(status="ok", seconds_per_step=row["train_seconds"] / w.steps)
            row["seconds_per_epoch"] = row["train_seconds"] / w.epochs
            print(
                f"[{i}/{len(pairs)}] {w.name} {c.name}: {row['train_seconds']:.3f} s "
                f"({row['seconds_per_step'] * 1e3:.4f} ms/step), setup {row['setup_seconds']:.2f} s, "
                f"train loss {_num(row['final_train_loss'])}, test acc {_num(row['test_accuracy'])}",
                flush=True,
            )
        except Exception as e:  # one contender failing must not lose the others' results
            failed += 1
            traceback.print_exc()
            row.update(status="error", error=f"{type(e).__name__}: {e}")
            print(f"[{i}/{len(pairs)}] {w.name} {c.name}: FAILED {row['error']}", flush=True)
        doc["rows"].append(row)
        doc["run"]["finished"] = time.time()
        write_json(path, doc)
    if not args.no_merge:
        write_outputs(out, plots=not args.no_plots)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
