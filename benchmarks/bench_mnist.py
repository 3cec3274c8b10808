"""Benchmark fastnn against PyTorch on Fashion-MNIST (issue 3); benchmarks/README.md says how and what.

    python benchmarks/bench_mnist.py --data DIR [--quick] [--out results/] [--only C,..] [--only-workload W,..]
    python benchmarks/bench_mnist.py --merge --out results/     # partial runs -> bench.md, bench_summary.json, graphs
    python benchmarks/bench_mnist.py --dry-run                  # the plan, on the CPU, without torch

Every (workload, contender) pair gives one row; after each row the run's partial JSON is rewritten under
out/raw/partial/, so a run cut short keeps what it finished, and runs split over several calls merge at the end.
Everything under out/raw/ (partial files, the merged bench.json, logs) stays out of git.
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
from end_to_end import DEFAULT_CACHE, E2E_CONTENDERS, E2E_WORKLOADS, TTA_CONTENDERS, TTA_WORKLOADS  # noqa: E402
from fastnn_contenders import Unavailable  # noqa: E402
from final import FINAL, PEERS  # noqa: E402,F401  (PEERS: the contenders that can be the fastest peer)
from report import PARTIAL_DIR, load_partials, write_outputs  # noqa: E402
from workloads import (  # noqa: E402
    LOSS_WORKLOADS,
    SEED,
    Contender,
    Workload,
    environment,
    load_data,
    plan_dict,
    select,
    settings,
    write_json,
)

#: The dry run trains (a tiny fake epoch on the CPU) only models up to this many parameters; larger: config only.
DRY_FIT_PARAMS = 2_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="Fashion-MNIST IDX files (default: fastnn.datasets' search order)")
    p.add_argument("--out", metavar="DIR", default="results", help="output folder (default: results)")
    p.add_argument("--quick", action="store_true", help="h in 128, 1024; 3 logreg epochs; 1,000 MLP steps")
    p.add_argument("--only", metavar="C[,C..]", help="contenders or groups (fastnn, torch, numpy, jax) to run")
    p.add_argument("--only-workload", metavar="W[,W..]", help="workloads: logreg, mlp-128, .., or mlp (all MLPs)")
    p.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile contenders (slow)")
    p.add_argument("--cpu-budget", type=float, default=60.0, metavar="S", help="seconds for numpy-cpu before scaling")
    p.add_argument("--merge", action="store_true", help="only merge out/raw/partial/*.json into the outputs")
    p.add_argument("--no-merge", action="store_true", help="write only this run's partial JSON")
    p.add_argument("--no-plots", action="store_true", help="write no graphs")
    p.add_argument("--dry-run", action="store_true", help="print the plan, build the fastnn trainers on the CPU, exit")
    p.add_argument("--e2e", action="store_true", help="also end to end: each contender in a fresh process, cold/warm")
    p.add_argument(
        "--e2e-only",
        metavar="C[,C..]",
        default=",".join(E2E_CONTENDERS),
        help="end-to-end contenders (jax-best: the fastest JAX configuration of the training rows)",
    )
    p.add_argument("--e2e-workload", metavar="W[,W..]", default=",".join(E2E_WORKLOADS), help="end-to-end workloads")
    p.add_argument("--tta", action="store_true", help="also time to accuracy (logreg to 84%%, MLP-128 to 88%%, "
                   "MLP-256 to 89%%)")  # fmt: skip
    p.add_argument("--tta-workload", metavar="W[,W..]", default=",".join(TTA_WORKLOADS),
                   help="time-to-accuracy workloads")  # fmt: skip
    p.add_argument(
        "--tta-only", metavar="C[,C..]", default=",".join(TTA_CONTENDERS), help="time-to-accuracy contenders"
    )
    p.add_argument("--no-train", action="store_true", help="no training-table rows (only --e2e/--tta)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="end-to-end cache folders (emptied for cold runs)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a subprocess is given up")
    p.add_argument(
        "--final",
        metavar="N",
        choices=sorted(FINAL),
        help="the published run's call N (README): " + "; ".join(f"{k}: {v[1]}" for k, v in FINAL.items()),
    )
    p.add_argument(
        "--drift",
        metavar="C[,C..]",
        default="",
        help="contenders this run repeats to show the drift "
        "between calls: merged beside the earlier rows instead of replacing them",
    )
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: subprocesses on tiny fake data
    args = p.parse_args(argv)
    if args.final:
        p.parse_args(FINAL[args.final][0] + (argv if argv is not None else sys.argv[1:]), namespace=args)
    if args.cpu_budget <= 0:
        p.error(f"--cpu-budget must be > 0, got {args.cpu_budget}")
    return args


def _pairs(contenders: list[Contender], workloads: list[Workload]) -> list[tuple[Workload, Contender]]:
    return [
        (w, c)
        for w in workloads
        for c in contenders
        if not (c.logreg_only and w.name != "logreg") and (c.workloads is None or w.name in c.workloads)
    ]


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
        print(f"  {'':18} settings: {settings(c)}")  # raises on a definition the runners would not understand
    print(f"pairs: {len(_pairs(contenders, workloads))}")


def dry_run(contenders: list[Contender], workloads: list[Workload], args: argparse.Namespace) -> int:
    """Build every fastnn trainer of the plan on the CPU; fit small ones one epoch on tiny fake data; run the JAX
    configurations on tiny CPU copies of the workloads where jax is installed."""
    from fastnn_contenders import Unavailable, engine_kwargs, make_trainer, rewind

    import fastnn
    from fastnn._model import init_parameters

    rng = np.random.default_rng(SEED)
    for w, c in _pairs(contenders, workloads):
        if c.family in ("torch", "jax"):
            continue
        try:
            engine_kwargs(c, "cuda")
        except Unavailable as e:
            print(f"  {w.name:9} {c.name:14} unavailable: {e}")
            continue
        if c.engine != "auto":
            print(f"  {w.name:9} {c.name:14} config ok (engine={c.engine!r} runs on a GPU only)")
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
            trainer.fit(x, y, epochs=1, progress=False)
            rewind(trainer, init_parameters(model, SEED), -(-n // w.batch_size))
            last = trainer.fit(x, y, epochs=1, progress=False)[-1]
            if not np.isfinite(last["train_loss"]):
                raise SystemExit(f"dry run: {c.name} on {w.name} gave loss {last['train_loss']}")
        print(f"  {w.name:9} {c.name:14} trainer ok on cpu (fake data, loss {last['train_loss']:.4f})")
    jax_contenders = [c for c in contenders if c.family == "jax"]
    if jax_contenders and importlib.util.find_spec("jax") is None:
        print("jax: not installed, JAX dry run skipped")
    for c in jax_contenders if importlib.util.find_spec("jax") is not None else []:
        ws = [w for w, cc in _pairs([c], workloads)]
        rows = _jax_dry(c, ws)
        for w, r in zip(ws, rows):
            if r.get("status") != "ok" or not np.isfinite(r["final_train_loss"] or np.nan):
                raise SystemExit(f"dry run: {c.name} on {w.name}: {r.get('error', r.get('final_train_loss'))}")
            print(f"  {w.name:9} {c.name:18} jax ok on cpu (tiny copy, loss {r['final_train_loss']:.4f})")
    print(f"torch imported: {'torch' in sys.modules}")
    return 0


def _jax_dry(c: Contender, workloads: list[Workload]) -> list[dict[str, Any]]:
    """The JAX subprocess of `c` on tiny CPU copies of `workloads` (its XLA_FLAGS included)."""
    import json
    import subprocess
    import tempfile

    from jax_contenders import subprocess_env

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        env = subprocess_env(c) | {"JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, str(Path(__file__).with_name("jax_contenders.py")), "--contender", c.name,
               "--workloads", ",".join(w.name for w in workloads), "--out", str(out), "--cpu"]  # fmt: skip
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if not out.exists():
            raise SystemExit(f"dry run: {c.name}'s subprocess failed: {(res.stdout + res.stderr)[-1500:]}")
        rows = json.loads(out.read_text())["rows"]
    return [rows.get(w.name, {"status": "error", "error": "no row"}) for w in workloads]


def preflight(contenders: list[Contender]) -> bool:
    """Exit with a clear message when a contender's device or library is missing; True when torch is needed."""
    if any(c.family == "fastnn" for c in contenders):
        from fastnn._device import cuda_status

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


def _base_row(w: Workload, c: Contender, run_id: str, drift: set[str]) -> dict[str, Any]:
    return {
        "workload": w.name,
        "contender": c.name,
        "family": c.family,
        "precision": c.precision,
        "kind": c.kind,
        "description": c.description,
        "settings": settings(c),
        "hidden": w.hidden,
        "epochs": w.epochs,
        "steps": w.steps,
        "run_id": run_id,
        "repeat": c.name in drift,
        **({"engine_requested": c.engine} if c.family == "fastnn" else {}),
        **({"xla_flags": c.xla_flags} if c.family == "jax" else {}),
    }


def _finish(row: dict[str, Any], w: Workload, label: str) -> None:
    """Derived numbers and the log line of one row."""
    if row.get("status") == "ok":
        row.update(seconds_per_step=row["train_seconds"] / w.steps, seconds_per_epoch=row["train_seconds"] / w.epochs)
        print(
            f"{label} {w.name} {row['contender']}: {row['train_seconds']:.3f} s "
            f"({row['seconds_per_step'] * 1e3:.4f} ms/step), setup {row['setup_seconds']:.2f} s, "
            f"train loss {_num(row['final_train_loss'])}, test acc {_num(row['test_accuracy'])}",
            flush=True,
        )
    else:
        print(f"{label} {w.name} {row['contender']}: {row['status'].upper()} {row.get('error', '')[:300]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.merge:
        write_outputs(out, plots=not args.no_plots)
        return 0
    contenders, workloads = select(args.only, args.only_workload, args.skip_compile, args.quick)
    if args.no_train:
        contenders = []
    print_plan(contenders, workloads)
    if args.dry_run:
        return dry_run(contenders, workloads, args)
    with_torch = preflight([c for c in contenders if c.family != "jax"])
    data = load_data(args.data) if any(c.family != "jax" for c in contenders) else None
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    pairs = _pairs(contenders, workloads)
    drift = {d for d in args.drift.split(",") if d}
    doc: dict[str, Any] = {
        "schema": 1,
        "run": {"run_id": run_id, "started": time.time(), "argv": sys.argv, "args": vars(args), "finished": None},
        "environment": environment(with_torch),
        "workloads": {w.name: plan_dict(w) for w in dict.fromkeys(w for w, _ in pairs)},
        "rows": [],
        "e2e_rows": [],
        "tta_rows": [],
    }
    path = out / PARTIAL_DIR / f"{run_id}.json"
    print(f"device: {doc['environment'].get('device')}; partial results: {path}")

    def save() -> None:
        doc["run"]["finished"] = time.time()
        write_json(path, doc)

    failed = 0
    in_process = [(w, c) for w, c in pairs if c.family != "jax"]
    for i, (w, c) in enumerate(in_process, 1):
        row = _base_row(w, c, run_id, drift)
        try:
            row.update(run_pair(w, c, data, args))
            row["status"] = "ok"
        except Unavailable as e:  # an engine this fastnn or device lacks: reported, not timed, not a failure
            row.update(status="unavailable", error=str(e))
        except Exception as e:  # one contender failing must not lose the others' results
            failed += 1
            traceback.print_exc()
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        _finish(row, w, f"[{i}/{len(in_process)}]")
        doc["rows"].append(row)
        save()
    # JAX: one fresh process per configuration (XLA_FLAGS are read when jax initialises), all its workloads
    for c in dict.fromkeys(c for _, c in pairs if c.family == "jax"):
        from jax_contenders import run_subprocess

        ws = [w for w, cc in pairs if cc is c]
        results, jax_env = run_subprocess(c, ws, args.data, args.quick, timeout_s=args.timeout * len(ws))
        doc["environment"].update({k: v for k, v in jax_env.items() if k != "xla_flags"})
        for w, res in zip(ws, results):
            row = _base_row(w, c, run_id, drift) | res
            failed += row.get("status") == "error"
            _finish(row, w, "[jax]")
            doc["rows"].append(row)
        save()
    if args.e2e or args.tta:
        from end_to_end import run_e2e, run_tta

        known = [r for d in load_partials(out) for r in d["rows"]] if (out / PARTIAL_DIR).is_dir() else []
        known += doc["rows"]
        if args.e2e:
            doc["e2e_rows"] = [r | {"run_id": run_id} for r in
                               run_e2e(_names(args.e2e_only), _names(args.e2e_workload), args, known)]  # fmt: skip
            save()
        if args.tta:
            rows = run_tta(_names(args.tta_only), args, known, workloads=_names(args.tta_workload))
            doc["tta_rows"] = [r | {"run_id": run_id} for r in rows]
            save()
        failed += sum(r["status"] == "error" for r in doc["e2e_rows"] + doc["tta_rows"])
    save()
    if not args.no_merge:
        write_outputs(out, plots=not args.no_plots)
    return 1 if failed else 0


def _names(spec: str) -> list[str]:
    return [s.strip() for s in spec.split(",") if s.strip()]


if __name__ == "__main__":
    raise SystemExit(main())
