"""Many models at once (issue 39): fastnn's MultiTrainer beside JAX vmap and torch.func, K models for one epoch.

Workloads (Fashion-MNIST's 60,000 training rows, one epoch): logreg, 784-10 at batch 128 (469 steps, the last of
96 rows), K = 1, 32, 128, 1024; mlp-128, 784-128-128-128-10 at batch 32 (1,875 steps), K = 1, 32, 128. Each model
its own learning rate, L2 penalty and init seed (many_contenders.hyperparameters), one shared sample order. The
contenders and the protocol are in many_contenders.py. Each row: the timed epoch (wall clock; fastnn also its
graph's device time), per model and step, and the best test accuracy of the K models.

    PYTHONPATH=$PWD python benchmarks/bench_many.py --data .data/fashion-mnist [--contenders fastnn,jax,torch]
        [--workloads logreg,mlp-128] [--ks 1,32,128,1024] [--profile] [--out many.json]
    (--contenders fastnn,fastnn-next --profile: the default kernels and the variants not yet measured, phase by
    phase: each node between events from Python, and each inside a CUDA graph of 20 copies, device time only)
    python benchmarks/bench_many.py --dry-run     # the plan, and every contender importable here run on the CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before any jax import: the GPU is shared

import numpy as np  # noqa: E402
from many_contenders import ManyWorkload, Result, hyperparameters, run_fastnn, run_jax, run_torch  # noqa: E402

import fastnn  # noqa: E402
from fastnn.engine import Tuning  # noqa: E402

WORKLOADS = {
    "logreg": (ManyWorkload("logreg", (784, 10), 128, 60_000, (0.02, 1.0)), (1, 32, 128, 1024)),
    "mlp-128": (ManyWorkload("mlp-128", (784, 128, 128, 128, 10), 32, 60_000, (0.005, 0.2)), (1, 32, 128)),
}
#: "fastnn-fold": the GPU engine with its opt-in fold_sgd (layer 0's SGD update inside its weight-gradient GEMM).
#: "fastnn-next": the GPU engine with the variants not yet measured (NEXT: the tiled loss, the float4 update, layer 0's
#: GEMMs autotuned; docs/design/many-models.md, "Next kernels"); beside "fastnn" with --profile, one call measures
#: both, phase by phase.
CONTENDERS = ("fastnn", "fastnn-fold", "fastnn-next", "jax", "torch")
NEXT = Tuning(many_loss_kernel="tiled", many_update_kernel="vec4", many_autotune=True)


def run(contender: str, wl: ManyWorkload, k: int, data: tuple, device: str, profile: bool) -> Result:
    if contender == "fastnn-next":
        return run_fastnn(wl, k, data, device=device, profile=profile, tuning=NEXT, name=contender)[0]
    if contender in ("fastnn", "fastnn-fold"):
        return run_fastnn(wl, k, data, device=device, profile=profile, fold=contender == "fastnn-fold")[0]
    if contender == "jax":
        return run_jax(wl, k, data)[0]
    return run_torch(wl, k, data, device=device)[0]


def table(results: list[Result]) -> str:
    lines = [f"{'workload':9} {'K':>5} {'contender':18} {'epoch ms':>9} {'device ms':>9} {'us/model-step':>13} "
             f"{'best test acc':>13}"]  # fmt: skip
    for r in results:
        dev = f"{1e3 * r.device_s:9.2f}" if r.device_s is not None else f"{'-':>9}"
        lines.append(f"{r.workload:9} {r.models:5d} {r.contender:18} {1e3 * r.epoch_s:9.2f} {dev} "
                     f"{r.per_model_step_us:13.3f} {r.best_accuracy:13.4f}")  # fmt: skip
    return "\n".join(lines)


def dry_run() -> int:
    """The plan, then each contender importable here on a tiny synthetic set on the CPU, checked against fastnn's
    NumPy engine (the same weights up to fp32 rounding: the contenders train the same models)."""
    for name, (wl, ks) in WORKLOADS.items():
        for k in ks:
            lrs, wds, seeds = hyperparameters(wl, k)
            print(f"{name:8} {'-'.join(map(str, wl.sizes)):22} batch {wl.batch:4d} {wl.steps:5d} steps  K={k:5d}  "
                  f"lr {lrs[0]:.3g}..{lrs[-1]:.3g}  wd {wds[0]:.3g}..{wds[-1]:.3g}  seeds {seeds[0]}..{seeds[-1]}")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(300, 784), dtype=np.uint8)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    data = (x, y, x[:100], y[:100])
    failures = 0
    for name, (wl, _) in WORKLOADS.items():
        tiny = replace(wl, samples=300, batch=64 if name == "logreg" else 32)
        res, mt = run_fastnn(tiny, 3, data, device="cpu")
        ref = mt.state_dicts()
        print(f"{name:8} fastnn (cpu, K=3): best test accuracy {res.best_accuracy:.3f} (model {res.best_model})")
        for contender, fn in (("jax", lambda t=tiny: run_jax(t, 3, data)),
                              ("torch", lambda t=tiny: run_torch(t, 3, data, device="cpu"))):  # fmt: skip
            if importlib.util.find_spec(contender) is None:
                print(f"{name:8} {contender}: not installed, skipped")
                continue
            try:
                res_c, params = fn()
                worst = max(float(np.abs(params[n][k] - ref[k][n]).max()) for k in range(3) for n in ref[0])
                ok = worst < 1e-4
                failures += not ok
                print(f"{name:8} {contender} (cpu, K=3): best test accuracy {res_c.best_accuracy:.3f}; largest "
                      f"difference from fastnn's weights {worst:.2e} {'ok' if ok else 'MISMATCH'}")
            except Exception:
                failures += 1
                traceback.print_exc()
    print("dry run", "ok" if not failures else f"FAILED ({failures})")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help="Fashion-MNIST's directory (fastnn.datasets root)")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--ks", default=None, help="model counts (default: each workload's)")
    p.add_argument("--profile", action="store_true", help="fastnn's phase profile of one step at each K (two ways)")
    p.add_argument("--out", default=None, help="write the rows as JSON")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.dry_run:
        return dry_run()
    x, y, xt, yt = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)  # the IDX files' folder
    data = (x, y.astype(np.int64), xt, yt.astype(np.int64))
    from fastnn.cuda import driver

    print(f"device: {driver.device_name(0)}")
    results: list[Result] = []
    for name in args.workloads.split(","):
        wl, ks = WORKLOADS[name]
        for k in [int(v) for v in args.ks.split(",")] if args.ks else ks:
            for contender in args.contenders.split(","):
                try:
                    r = run(contender, wl, k, data, "cuda", args.profile)
                except Exception:
                    print(f"{name} K={k} {contender}: failed")
                    traceback.print_exc()
                    continue
                results.append(r)
                print(table([r]).splitlines()[1], flush=True)
                if r.profile:
                    print("    phases (us):", ", ".join(f"{n} {t:.1f}" for n, t in r.profile.items()), flush=True)
                if r.profile_graphed:
                    print("    phases in graphs (us):", ", ".join(f"{n} {t:.1f}" for n, t in r.profile_graphed.items()),
                          flush=True)  # fmt: skip
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) | {"per_model_step_us": r.per_model_step_us}
                                              for r in results], indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
