"""fastnn.sklearn.GridSearchCV against scikit-learn's GridSearchCV, on Fashion-MNIST (issue 40's target).

    python benchmarks/bench_search.py --data .data/fashion-mnist            # the three contenders, one GPU
    python benchmarks/bench_search.py --data .data/fashion-mnist --gpus 2   # + fastnn's search on 2 GPUs
    python benchmarks/bench_search.py --dry-run                             # CPU: the plan, tiny runs

The search: 64 candidates (learning_rate_init x alpha x random_state, 4 each) x 5 folds of
MLPClassifier(hidden_layer_sizes=(128,), max_iter=--epochs) on the 60,000 training images scaled to [0, 1],
refit=False (the search alone is timed). Contenders, each the wall time of `search.fit`:

- fastnn-search: fastnn.sklearn.GridSearchCV over fastnn's MLPClassifier (device="cuda"): 4 many-model fits
  (one per seed) of 80 models each; with --gpus N, n_jobs=N spreads them over N GPUs.
- sklearn-search-fastnn: sklearn.model_selection.GridSearchCV over the same estimator on the same GPU, fit by fit.
  --sklearn-candidates C times the first C candidates (all their folds) and scales to 64 (stated in the output).
- sklearn-cpu: scikit-learn's own MLPClassifier (same grid, adam, batch 200) in sklearn's GridSearchCV with
  n_jobs=-1 on the machine's CPUs; --cpu-candidates C times the first C candidates and scales to 64.

Both fastnn contenders use precision --precision (fp32 by default: the many-model engine computes in fp32, so
fp32 compares like with like) and run a small warm-up search first (NVRTC and CUDA start, untimed). The scores
of the two fastnn searches are compared (max |difference| of mean_test_score, and whether best_params_ agree).
--optuna times one ask-and-tell round of 32 trials (docs/guide/search.md's recipe: lr x weight decay, AdamW,
MultiTrainer) against the same 32 trials trained one Trainer each; --dask runs fastnn's search under joblib's
Dask backend on a local cluster of one worker per GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastnn  # noqa: E402

GRID = {
    "learning_rate_init": [3e-4, 1e-3, 3e-3, 1e-2],
    "alpha": [1e-5, 1e-4, 1e-3, 1e-2],
    "random_state": [0, 1, 2, 3],
}
#: The dry run's grid: 2 of each (8 candidates), so that every path runs on the CPU in seconds.
SMALL_GRID = {name: values[1:3] for name, values in GRID.items()}
FOLDS = 5


def candidates(grid: dict[str, list], first: int | None) -> list[dict[str, list]]:
    """The grid as a list of one-candidate grids (scikit-learn's ParameterGrid order), the first `first` of them."""
    from sklearn.model_selection import ParameterGrid

    cands = list(ParameterGrid(grid))
    return [{k: [v] for k, v in c.items()} for c in cands[: first or len(cands)]]


def fastnn_estimator(args: argparse.Namespace, device: str) -> Any:
    from fastnn.sklearn import MLPClassifier

    return MLPClassifier(hidden_layer_sizes=(args.hidden,), max_iter=args.epochs, device=device,
                         precision=args.precision)  # fmt: skip


def timed_fit(search: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of every fit: max_iter is a fixed budget here
        start = time.perf_counter()
        search.fit(x, y)
        return time.perf_counter() - start, search


def run_fastnn(args: argparse.Namespace, x: np.ndarray, y: np.ndarray, device: str, n_jobs: int | None) -> dict:
    from fastnn.sklearn import GridSearchCV

    search = GridSearchCV(fastnn_estimator(args, device), args.grid, cv=FOLDS, refit=False, n_jobs=n_jobs)
    seconds, search = timed_fit(search, x, y)
    plan = search.plan_
    return {"seconds": seconds, "search": search, "note": f"{len(plan.groups)} many-model fits of "
            f"{[len(g.models) for g in plan.groups]} models, {len(plan.fallback)} fits fell back, n_jobs={n_jobs}"}


def run_sklearn_over_fastnn(args: argparse.Namespace, x: np.ndarray, y: np.ndarray, device: str) -> dict:
    from sklearn.model_selection import GridSearchCV

    grid = candidates(args.grid, args.sklearn_candidates)
    search = GridSearchCV(fastnn_estimator(args, device), grid, cv=FOLDS, refit=False)
    seconds, search = timed_fit(search, x, y)
    scale = args.candidates / len(grid)
    note = "every candidate" if scale == 1 else f"timed {len(grid)} candidates x {FOLDS} folds, scaled x{scale:g}"
    return {"seconds": seconds * scale, "search": search, "note": note, "complete": scale == 1}


def run_sklearn_cpu(args: argparse.Namespace, x: np.ndarray, y: np.ndarray) -> dict:
    from sklearn.model_selection import GridSearchCV
    from sklearn.neural_network import MLPClassifier

    grid = candidates(args.grid, args.cpu_candidates)
    est = MLPClassifier(hidden_layer_sizes=(args.hidden,), max_iter=args.epochs, batch_size=200)
    search = GridSearchCV(est, grid, cv=FOLDS, refit=False, n_jobs=-1)
    seconds, search = timed_fit(search, x, y)
    scale = args.candidates / len(grid)
    note = f"n_jobs=-1 on {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); " + (
        "every candidate" if scale == 1 else f"timed {len(grid)} candidates x {FOLDS} folds, scaled x{scale:g}")
    return {"seconds": seconds * scale, "search": search, "note": note}


def run_optuna_round(args: argparse.Namespace, x: np.ndarray, y: np.ndarray, device: str, trials: int = 32) -> dict:
    """One round of `trials` configurations (lr, weight decay log-uniform), AdamW: one MultiTrainer against one
    Trainer each; the validation loss is on the last sixth of the rows (10,000 of 60,000)."""
    rng = np.random.default_rng(0)
    lr = np.exp(rng.uniform(np.log(1e-4), np.log(1e-1), trials))
    wd = np.exp(rng.uniform(np.log(1e-6), np.log(1e-1), trials))
    val = len(x) // 6
    xt, yt, xv, yv = x[:-val], y[:-val], x[-val:], y[-val:]
    model = fastnn.MLP([x.shape[1], args.hidden, 10])
    start = time.perf_counter()
    with fastnn.MultiTrainer(model, fastnn.AdamW(), lr=lr, weight_decay=wd, seeds=0, batch_size=128,
                             device=device) as mt:  # fmt: skip
        mt.fit(xt, yt, epochs=args.epochs)
        multi = [r["loss"] for r in mt.evaluate(xv, yv)]
    batched = time.perf_counter() - start
    start = time.perf_counter()
    for k in range(trials):
        with fastnn.Trainer(model, fastnn.AdamW(lr=float(lr[k]), weight_decay=float(wd[k])), batch_size=128,
                            device=device, precision="fp32", seed=k) as t:  # fmt: skip
            t.fit(xt, yt, epochs=args.epochs, progress=False)
            t.evaluate(xv, yv)
    one_by_one = time.perf_counter() - start
    return {"trials": trials, "multitrainer_s": batched, "trainer_each_s": one_by_one, "best_val_loss": min(multi)}


def run_dask(args: argparse.Namespace, x: np.ndarray, y: np.ndarray, gpus: int) -> dict:
    """fastnn's search under joblib's Dask backend, a local cluster of one single-threaded worker per GPU."""
    import joblib
    from distributed import Client, Nanny, Scheduler, SpecCluster

    from fastnn.sklearn import GridSearchCV

    workers = {f"gpu{i}": {"cls": Nanny, "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}}}
               for i in range(gpus)}  # fmt: skip
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster), \
            joblib.parallel_backend("dask"):  # fmt: skip
        search = GridSearchCV(fastnn_estimator(args, "cuda"), args.grid, cv=FOLDS, refit=False)
        seconds, search = timed_fit(search, x, y)
    return {"seconds": seconds, "search": search, "note": f"{gpus} Dask workers, one GPU each"}


def compare(a: Any, b: Any) -> str:
    """How two searches' results agree: the largest difference of mean test scores, and the best candidates."""
    pa = [tuple(sorted(p.items())) for p in a.cv_results_["params"]]
    pb = {tuple(sorted(p.items())): i for i, p in enumerate(b.cv_results_["params"])}
    common = [(i, pb[p]) for i, p in enumerate(pa) if p in pb]
    ma, mb = a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"]
    diff = max(abs(ma[i] - mb[j]) for i, j in common)
    best_a = a.cv_results_["params"][max(common, key=lambda ij: (ma[ij[0]], -ij[0]))[0]]  # of the common ones
    best_b = b.cv_results_["params"][max(common, key=lambda ij: (mb[ij[1]], -ij[1]))[1]]
    return f"max |mean_test_score difference| {diff:.4f} over {len(common)} candidates; best_params_ " + (
        f"the same: {best_a}" if best_a == best_b else f"DIFFER: {best_a} vs {best_b}")


def plan_of(grid: dict[str, list]) -> str:
    """How fastnn's search groups `grid`'s fits on Fashion-MNIST's shape (planned, not trained)."""
    from sklearn.model_selection import KFold, ParameterGrid

    from fastnn.sklearn import MLPClassifier, _plan

    x, y = np.zeros((60000, 784), np.float32), np.arange(60000) % 10
    folds = list(KFold(FOLDS).split(x))
    plan = _plan.make_plan(MLPClassifier(hidden_layer_sizes=(128,)), list(ParameterGrid(grid)), folds, x, y, {})
    return f"{len(plan.groups)} many-model fits of {[len(g.models) for g in plan.groups]} models"


def gpu_name() -> str:
    try:
        from fastnn.cuda import driver

        return driver.get_device(0).name
    except Exception as exc:  # the dry run has none
        return f"no GPU ({type(exc).__name__})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="the Fashion-MNIST folder (IDX files); default: fastnn.datasets' search path")
    ap.add_argument("--epochs", type=int, default=10, help="max_iter of every fit (a fixed budget)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--rows", type=int, default=60000, help="training images used (the first ROWS)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--gpus", type=int, default=1, help="also run fastnn's search with n_jobs=GPUS (when > 1)")
    ap.add_argument("--sklearn-candidates", type=int, default=None, help="time the first C of 64 and scale")
    ap.add_argument("--cpu-candidates", type=int, default=8, help="time the first C of 64 and scale")
    ap.add_argument("--skip", default="", help="comma-separated contenders to leave out")
    ap.add_argument("--optuna", action="store_true")
    ap.add_argument("--dask", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny synthetic data: every path once")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    device, args.grid = "cuda", GRID
    if args.dry_run:  # every contender's code path on the CPU in seconds; the timings mean nothing
        args.epochs, args.hidden, args.rows, args.grid = 1, 8, 300, SMALL_GRID
        args.sklearn_candidates, args.cpu_candidates, device = 2, 2, "cpu"
        print(f"plan of the real search: {plan_of(GRID)}")
        rng = np.random.default_rng(0)
        x, y = rng.random((args.rows, 784), dtype=np.float32), rng.integers(0, 10, args.rows)
    else:
        x_all, y_all, _, _ = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
        x, y = (x_all[: args.rows].astype(np.float32) / 255.0), y_all[: args.rows].astype(np.int64)
    args.candidates = len(candidates(args.grid, None))
    print(f"device: {gpu_name() if device == 'cuda' else 'cpu (dry run)'}; {len(x)} rows; {args.candidates} "
          f"candidates x {FOLDS} "
          f"folds; MLPClassifier(hidden_layer_sizes=({args.hidden},), max_iter={args.epochs}); "
          f"precision={args.precision}")  # fmt: skip
    if device == "cuda":  # NVRTC compiles and CUDA starts here, untimed
        from fastnn.sklearn import GridSearchCV as FastSearch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            FastSearch(fastnn_estimator(args, device), {"alpha": [1e-4, 1e-3]}, cv=2, refit=False).fit(x[:2000],
                                                                                                       y[:2000])
            fastnn_estimator(args, device).set_params(max_iter=1).fit(x[:2000], y[:2000])
            if args.gpus > 1:  # every GPU's context and module, with one group per GPU
                widths = {"hidden_layer_sizes": [(args.hidden + 8 * i,) for i in range(args.gpus)]}
                FastSearch(fastnn_estimator(args, device), widths, cv=2, refit=False, n_jobs=args.gpus).fit(x[:2000],
                                                                                                          y[:2000])
    rows: dict[str, dict] = {}
    if "fastnn-search" not in skip:
        rows["fastnn-search"] = run_fastnn(args, x, y, device, None)
    if args.gpus > 1 and "fastnn-search" not in skip:
        rows[f"fastnn-search-{args.gpus}gpu"] = run_fastnn(args, x, y, device, args.gpus)
    if "sklearn-search-fastnn" not in skip:
        rows["sklearn-search-fastnn"] = run_sklearn_over_fastnn(args, x, y, device)
    if "sklearn-cpu" not in skip:
        rows["sklearn-cpu"] = run_sklearn_cpu(args, x, y)
    if args.dask and device == "cuda":
        rows["fastnn-search-dask"] = run_dask(args, x, y, max(1, args.gpus))
    base = rows.get("fastnn-search", {}).get("seconds")
    print(f"{'contender':26} {'seconds':>9} {'per fit ms':>11} {'vs fastnn':>10}  note")
    for name, r in rows.items():
        ratio = f"{r['seconds'] / base:9.1f}x" if base else "         -"
        per_fit = r["seconds"] / (args.candidates * FOLDS) * 1e3
        print(f"{name:26} {r['seconds']:9.2f} {per_fit:11.2f} {ratio}  {r['note']}")
    if "fastnn-search" in rows and "sklearn-search-fastnn" in rows:
        print("fastnn-search vs sklearn-search-fastnn:", compare(rows["fastnn-search"]["search"],
                                                                 rows["sklearn-search-fastnn"]["search"]))
    if f"fastnn-search-{args.gpus}gpu" in rows:
        multi = rows[f"fastnn-search-{args.gpus}gpu"]["seconds"]
        print(f"{args.gpus} GPUs: {base / multi:.2f}x one GPU")
    optuna_row = None
    if args.optuna:
        optuna_row = run_optuna_round(args, x, y, device)
        print(f"optuna round of {optuna_row['trials']} trials: MultiTrainer {optuna_row['multitrainer_s']:.2f} s, "
              f"one Trainer each {optuna_row['trainer_each_s']:.2f} s "
              f"({optuna_row['trainer_each_s'] / optuna_row['multitrainer_s']:.1f}x)")  # fmt: skip
    if args.out:
        out = {"device": gpu_name() if device == "cuda" else "cpu", "args": vars(args),
               "contenders": {n: {k: v for k, v in r.items() if k != "search"} for n, r in rows.items()},
               "optuna": optuna_row}  # fmt: skip
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print("dry run: done" if args.dry_run else "done")


if __name__ == "__main__":
    main()
