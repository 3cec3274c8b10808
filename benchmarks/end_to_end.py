"""End to end and time to accuracy: every contender in a fresh process, from its start to trained weights on the GPU.

End to end (issue 11): the parent notes the wall clock, starts `python end_to_end.py --worker ...`, and the worker
reports, relative to that moment, when it had imported its libraries, loaded the data, set up (data to the GPU,
compile/capture/autotune where separable) and trained the workload's epochs (synchronised). Cold: empty caches
(FASTNN_CACHE_DIR, FASTNN_DATASET_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and CUDA_CACHE_PATH, the driver's and NVRTC's
compute cache, fresh; JAX's persistent compilation cache off). Warm: the same fixed cache folders after a run that
populated them (JAX's persistent cache on, every entry kept). bench_setup.py runs the same workers for issue 26's
set-up table (one epoch, cold / warm / warm again).

Time to accuracy: `workloads.tta_workloads()` (the seeds' logreg to 0.84 and MLP-128 to 0.88; MLP 784-256-256-10,
AdamW, to 0.89; all 60,000 images), test accuracy
after every epoch; the run stops at the first epoch that reaches the target. End to end = from the start to the
end of that epoch's evaluation; training only = the sum of the epochs' training times up to it (compile and
capture excluded where the contender separates them, evaluations excluded).

Contenders here: `fastnn-mixed` (engine "auto"), `fastnn-graph`, `fastnn-fused`, `torch-graph-amp`
(`torch-compile-amp` on request), and the JAX configurations (`jax-best`: the fastest JAX configuration of the
training rows already in the output folder, else jax-fp32).
"""

from __future__ import annotations

import time

T_IMPORTED_HARNESS = time.time()  # noqa: E402  (the worker's first moment: before numpy, fastnn, torch or jax)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

__all__ = [
    "E2E_CONTENDERS",
    "E2E_WORKLOADS",
    "TTA_CONTENDERS",
    "TTA_WORKLOADS",
    "best_jax",
    "run_e2e",
    "run_tta",
    "worker",
]

#: The published end-to-end table: each engine of fastnn against the strongest peers.
#: torch-compile-amp is left out by default: ~45 s of compilation per width, cold and warm, does not fit the final
#: run's calls (its training row's setup is a lower bound of its end-to-end time); `--e2e-only` can add it.
E2E_CONTENDERS = ("fastnn-mixed", "fastnn-graph", "fastnn-fused", "torch-graph-amp", "jax-best")
E2E_WORKLOADS = ("logreg", "mlp-128", "mlp-1024", "mlp-8192")
TTA_CONTENDERS = ("fastnn-mixed", "fastnn-graph", "fastnn-fused", "torch-graph-amp", "jax-best")
#: The time-to-accuracy workloads run by default: the seeds' two (logreg to 0.84, MLP-128 to 0.88) and MLP-256 to 0.89.
TTA_WORKLOADS = ("tta-logreg", "tta-mlp-128", "tta-mlp-256")
MODES = ("cold", "warm")
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fastnn-bench-cache"


# ---- the worker: one contender, one workload, a fresh process -------------------------------------------------


class _Fastnn:
    """fastnn's Trainer; data goes to the GPU and the graph is captured inside the first fit."""

    def __init__(self, contender: Any, w: Any, data: tuple) -> None:
        from fastnn_contenders import make_trainer

        self.w, self.data = w, data
        self.x, self.y = data[0][: w.samples], data[1][: w.samples]
        self.trainer = make_trainer(contender, w, check_init=False)  # the user's set-up only (make_trainer says)

    def train(self, epochs: int) -> list[float]:
        """Train `epochs` epochs in one fit (epoch orders 0..); per-epoch device times (History)."""
        return [float(s) for s in self.trainer.fit(self.x, self.y, epochs=epochs, progress=False)["seconds"]]

    def evaluate(self) -> float:
        return float(self.trainer.evaluate(self.data[2], self.data[3])["accuracy"])

    def close(self) -> dict[str, Any]:
        engine = getattr(self.trainer, "engine", "graph")
        self.trainer.close()
        return {"engine": engine}


class _Torch:
    """A torch contender of torch_contenders (graph: warm-up steps and capture here; compile: in the first epoch)."""

    def __init__(self, contender: Any, w: Any, data: tuple) -> None:
        import torch
        import torch_contenders as tc

        tc.set_matmul_precision(contender)
        self.torch, self.w = torch, w
        self.job = tc._Job(w, data, torch.device("cuda"), amp=contender.precision == "amp")
        self.runner = tc.make_runner(self.job, contender)
        self.job.reset()  # the graph's side-stream warm-up steps trained: back to the initial weights and state
        torch.cuda.synchronize()
        self.epoch = 0

    def train(self, epochs: int) -> list[float]:
        from workloads import epoch_orders

        torch = self.torch
        orders = torch.from_numpy(epoch_orders(self.w, self.epoch, epochs)).cuda()
        losses = torch.zeros(self.w.steps_per_epoch, device="cuda")
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(epochs + 1)]
        marks[0].record()
        for e in range(epochs):
            self.runner.run_epoch(orders[e], losses)
            marks[e + 1].record()
        torch.cuda.synchronize()
        self.epoch += epochs
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks[:-1], marks[1:])]

    def evaluate(self) -> float:
        return self.job.evaluate()[1]

    def close(self) -> dict[str, Any]:
        self.runner.close()
        return {}


class _Jax:
    """JAX: data to the device and the epoch compiled ahead of time here; epochs timed with block_until_ready."""

    def __init__(self, contender: Any, w: Any, data: tuple) -> None:
        import jax
        from jax_contenders import Job

        self.jax, self.w = jax, w
        self.job = Job(w, data, amp=contender.precision == "amp", matmul_precision=contender.matmul_precision)
        self.compile_seconds = self.job.compile()
        self.state, self.epoch = self.job.init, 0

    def train(self, epochs: int) -> list[float]:
        out = []
        for _ in range(epochs):
            order = self.job.order(self.epoch)
            self.jax.block_until_ready(order)
            t0 = time.perf_counter()
            self.state, _ = self.job.epoch_fn(self.state, self.job.x, self.job.y, order)
            self.jax.block_until_ready(self.state)
            out.append(time.perf_counter() - t0)
            self.epoch += 1
        return out

    def evaluate(self) -> float:
        return self.job.evaluate(self.state[0])[1]

    def close(self) -> dict[str, Any]:
        from jax_contenders import jax_environment

        return {"compile_seconds": self.compile_seconds, **jax_environment()}


def _import_family(family: str) -> None:
    """Import what the contender's user imports (timed as 'import')."""
    import fastnn  # noqa: F401  (everybody loads the data through fastnn.datasets)

    if family == "torch":
        import torch

        torch.cuda.init()
    elif family == "jax":
        import jax

        jax.devices()


def worker(argv: list[str]) -> int:
    """`--worker`: one fresh-process run; writes its JSON to --out. Times are seconds since the parent's --t0."""
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--contender", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tiny", action="store_true", help="tests: a CPU-sized workload on fake data")
    p.add_argument("--family", help="import the contender's libraries first, so 'imported' times only them")
    p.add_argument("--epochs", type=int, help="train this many epochs instead of the workload's")
    p.add_argument("--no-eval", action="store_true", help="exit once trained (no test accuracy)")
    args = p.parse_args(argv)
    t0 = args.t0
    marks = {"process_start": T_IMPORTED_HARNESS - t0}
    if args.family:
        _import_family(args.family)
        marks["imported"] = time.time() - t0
    from workloads import CONTENDERS, all_workloads, load_data, tta_workloads

    contender = next(c for c in CONTENDERS if c.name == args.contender)
    plan = tta_workloads() + all_workloads(args.quick)
    w = next(x for x in plan if x.name == args.workload)
    tta = w.target_accuracy is not None
    if args.tiny:
        w = _tiny(w)
    if args.epochs is not None:
        w = dataclasses.replace(w, epochs=args.epochs)
    if not args.family:
        _import_family(contender.family)
        marks["imported"] = time.time() - t0
    marks["harness_ready"] = time.time() - t0  # the harness's own modules (workloads) are not the user's import
    data = _fake_data(w.samples) if args.tiny else load_data(args.data)
    marks["data_loaded"] = time.time() - t0
    adapter = {"fastnn": _Fastnn, "numpy": _Fastnn, "torch": _Torch, "jax": _Jax}[contender.family](contender, w, data)
    marks["set_up"] = time.time() - t0
    result: dict[str, Any] = {"status": "ok", "marks": marks}
    if tta:
        epochs = []
        for e in range(w.epochs):
            seconds = adapter.train(1)[0]
            trained = time.time() - t0
            acc = adapter.evaluate()
            epochs.append({"epoch": e + 1, "train_seconds": seconds, "trained_at": trained,
                           "evaluated_at": time.time() - t0, "test_accuracy": acc})  # fmt: skip
            if acc >= w.target_accuracy:
                break
        result.update(tta_summary(epochs, w.target_accuracy))
    else:
        epoch_seconds = adapter.train(w.epochs)
        marks["trained"] = time.time() - t0
        result.update(e2e_seconds=marks["trained"], train_seconds=float(sum(epoch_seconds)),
                      epoch_seconds=epoch_seconds,
                      test_accuracy=None if args.no_eval else adapter.evaluate())  # fmt: skip
    result.update(adapter.close())
    Path(args.out).write_text(json.dumps(result))
    return 0


def tta_summary(epochs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Time to `target`: the first epoch at or above it; end to end (its evaluation's end) and training only."""
    hit = next((i for i, e in enumerate(epochs) if e["test_accuracy"] >= target), None)
    out: dict[str, Any] = {"epochs": epochs, "target_accuracy": target, "reached": hit is not None}
    if hit is None:
        out.update(epochs_to_target=None, e2e_seconds=None, train_seconds=None)
    else:
        out.update(epochs_to_target=hit + 1, e2e_seconds=epochs[hit]["evaluated_at"],
                   train_seconds=float(sum(e["train_seconds"] for e in epochs[: hit + 1])))  # fmt: skip
    out["best_accuracy"] = max(e["test_accuracy"] for e in epochs) if epochs else None
    return out


def _tiny(w: Any) -> Any:
    from jax_contenders import _tiny as tiny

    return tiny(w)


def _fake_data(n: int) -> tuple:
    from jax_contenders import _fake_data as fake

    return fake(n)


# ---- the parent: subprocesses, cache folders, rows ------------------------------------------------------------


def best_jax(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """The JAX configuration with the least total training time over the workloads every JAX row shares."""
    from workloads import CONTENDERS

    jax_names = [c.name for c in CONTENDERS if c.family == "jax"]
    ok = [r for r in rows if r.get("contender") in jax_names and r.get("status") == "ok"]
    per: dict[str, dict[str, float]] = {}
    for r in ok:
        per.setdefault(r["contender"], {})[r["workload"]] = r["train_seconds"]
    if not per:
        return "jax-fp32", "no JAX training rows: the default configuration"
    common = set.intersection(*(set(v) for v in per.values()))
    if not common:
        return "jax-fp32", "JAX training rows share no workload: the default configuration"
    name = min(per, key=lambda c: sum(per[c][w] for w in common))
    return name, f"least training time summed over {', '.join(sorted(common))} among {', '.join(sorted(per))}"


def cache_env(contender: Any, workload: str, mode: str, cache_root: Path, base: dict[str, str]) -> dict[str, str]:
    """The subprocess environment of one (contender, workload, mode): cache folders and the JAX flags."""
    env = dict(base)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    for k in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):  # fmt: skip
        env.pop(k, None)
    if contender.family == "jax":
        from jax_contenders import subprocess_env

        env = subprocess_env(contender, env)
    root = cache_root / contender.name / workload
    env["FASTNN_CACHE_DIR"] = str(root / "fastnn")  # compiled kernels and cuBLASLt's autotuning choices
    env["FASTNN_DATASET_CACHE_DIR"] = str(root / "decoded")  # the decoded dataset files
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    env["TRITON_CACHE_DIR"] = str(root / "triton")
    # The CUDA driver's compute cache, which NVRTC 12.9+ also fills with every program it compiles (keyed by source
    # and options, under ~/.nv/ComputeCache by default): shared, it made later contenders' "cold" compiles hits.
    env["CUDA_CACHE_PATH"] = str(root / "nv")
    if mode == "warm" and contender.family == "jax":
        env["JAX_COMPILATION_CACHE_DIR"] = str(root / "jax")
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def _spawn(contender: Any, workload: str, env: dict[str, str], args: argparse.Namespace,
           epochs: int | None = None, evaluate: bool = True) -> dict[str, Any]:  # fmt: skip
    """One fresh worker process; its result (with `process_seconds`: its whole life, start to exit, as the parent
    saw it), or an error row saying why it has none. `epochs` overrides the workload's; without `evaluate` the
    worker exits once trained (no test accuracy)."""
    with tempfile.TemporaryDirectory(prefix="fastnn-e2e-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--contender", contender.name,
               "--workload", workload, "--out", str(out), "--family", contender.family]  # fmt: skip
        if args.data:
            cmd += ["--data", args.data]
        if args.quick:
            cmd.append("--quick")
        if args.tiny:
            cmd.append("--tiny")
        if epochs is not None:
            cmd += ["--epochs", str(epochs)]
        if not evaluate:
            cmd.append("--no-eval")
        t0 = time.time()
        try:
            res = subprocess.run(cmd + ["--t0", repr(t0)], env=env, capture_output=True, text=True,
                                 timeout=args.timeout)  # fmt: skip
            why = f"worker exit {res.returncode}: {(res.stdout + res.stderr)[-1500:]}"
        except subprocess.TimeoutExpired:
            why = f"worker timed out after {args.timeout:.0f} s"
        process_seconds = time.time() - t0
        if out.exists():
            return {**json.loads(out.read_text()), "process_seconds": process_seconds}
    if "Unavailable" in why:  # fastnn_contenders.Unavailable: an engine this build or device does not have
        return {"status": "unavailable", "error": why.strip().splitlines()[-1][-300:]}
    return {"status": "error", "error": why[-800:]}


def _resolve(names: list[str], rows: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    """(contender, how it was chosen) for each name; 'jax-best' picks from the training rows."""
    from workloads import CONTENDERS

    by_name = {c.name: c for c in CONTENDERS}
    out = []
    for n in names:
        if n == "jax-best":
            name, why = best_jax(rows)
            out.append((by_name[name], f"jax-best: {why}"))
        elif n in by_name:
            out.append((by_name[n], ""))
        else:
            raise SystemExit(f"unknown end-to-end contender {n!r}; known: {', '.join([*by_name, 'jax-best'])}")
    return out


def run_e2e(names: list[str], workloads: list[str], args: argparse.Namespace, rows: list[dict[str, Any]],
            log: Any = print) -> list[dict[str, Any]]:  # fmt: skip
    """Cold then warm, each (contender, workload) in fresh processes; one row per (contender, workload, mode).

    Cold empties the pair's cache folders first (the run populates fastnn's and inductor's); JAX's warm run is
    preceded by an unrecorded run that populates its persistent cache.
    """
    cache_root = Path(args.cache_dir)
    out = []
    for contender, chosen in _resolve(names, rows):
        for wname in workloads:
            shutil.rmtree(cache_root / contender.name / wname, ignore_errors=True)
            for mode in MODES:
                env = cache_env(contender, wname, mode, cache_root, dict(os.environ))
                if mode == "warm" and contender.family == "jax":
                    _spawn(contender, wname, env, args)  # populates the persistent compilation cache
                res = _spawn(contender, wname, env, args)
                row = {"table": "e2e", "workload": wname, "contender": contender.name, "family": contender.family,
                       "mode": mode, "chosen": chosen, "xla_flags": contender.xla_flags, **res}  # fmt: skip
                out.append(row)
                log(f"e2e {mode:4} {wname:9} {contender.name:18} " + (
                    f"{row['e2e_seconds']:.2f} s (training {row['train_seconds']:.3f} s)" if row["status"] == "ok"
                    else f"{row['status']}: {row.get('error', '')[-200:]}"), flush=True)  # fmt: skip
    return out


def run_tta(names: list[str], args: argparse.Namespace, rows: list[dict[str, Any]],
            log: Any = print, workloads: list[str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Time to accuracy, cold caches, one fresh process per (contender, workload); `workloads`: names of
    workloads.tta_workloads() (default: TTA_WORKLOADS)."""
    from workloads import tta_workloads

    plans = {w.name: w for w in tta_workloads()}
    unknown = [n for n in workloads or TTA_WORKLOADS if n not in plans]
    if unknown:
        raise SystemExit(f"unknown time-to-accuracy workload(s) {', '.join(unknown)}; known: {', '.join(plans)}")
    cache_root = Path(args.cache_dir)
    out = []
    for (contender, chosen), w in [(c, plans[n]) for c in _resolve(names, rows) for n in workloads or TTA_WORKLOADS]:
        shutil.rmtree(cache_root / contender.name / w.name, ignore_errors=True)
        env = cache_env(contender, w.name, "cold", cache_root, dict(os.environ))
        res = _spawn(contender, w.name, env, args)
        row = {"table": "tta", "workload": w.name, "contender": contender.name, "family": contender.family,
               "mode": "cold", "chosen": chosen, "xla_flags": contender.xla_flags, **res}  # fmt: skip
        out.append(row)
        if row["status"] == "ok" and row.get("reached"):
            log(
                f"tta {w.name:11} {contender.name:18} {row['target_accuracy']} after {row['epochs_to_target']} epochs: "
                f"{row['e2e_seconds']:.2f} s end to end, {row['train_seconds']:.3f} s training",
                flush=True,
            )
        else:
            log(f"tta {w.name:11} {contender.name:18} {row['status']}: not reached "
                f"(best {row.get('best_accuracy')}) {row.get('error', '')[-200:]}", flush=True)  # fmt: skip
    return out


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        raise SystemExit(worker(sys.argv[1:]))
    raise SystemExit("end_to_end.py runs from bench_mnist.py (--e2e, --tta); --worker is its subprocess")
