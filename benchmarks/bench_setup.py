"""From `python` to a trained model (issue 26): where a fresh process's time goes, for every engine and workload.

Each (contender, workload) runs one epoch three times in fresh processes (end_to_end.py's worker) with the same
cache folders, emptied before the first: cold (no compiled kernels, autotuning choices, decoded dataset, JAX
persistent compilation cache, nor the CUDA compute cache where NVRTC 12.9+ keeps every program it compiled), warm
(filled by the cold run), warm again. Per run it reports

    whole process        the parent's wall clock from starting the interpreter to its exit (trained, not evaluated)
    python start         the interpreter up to the harness's first line
    import               the contender's user imports: `import fastnn` (numpy with it); torch / jax with their
                         device initialisation beside it
    dataset load         `fastnn.datasets.load("fashion-mnist", ...)` (everybody loads it that way)
    set-up + first epoch fastnn: `Trainer(...)` + `fit(epochs=1)`; torch: graph capture + the epoch; JAX: the
                         ahead-of-time compile + the epoch
    of which training    the epoch's device time (fastnn's History, CUDA events / block_until_ready elsewhere)

and writes the tables as markdown to --out (and the rows as JSON beside it). With --fit-evaluate it measures instead
(issue 41) what the first fit and evaluation of a process cost against the second: each (fastnn contender,
workload) runs in one fresh process per mode (cold: empty caches; warm: filled by the cold run), which twice
builds a Trainer, fits one epoch, evaluates the test set (--eval-rows) and closes the trainer, timing each.
The CPU engine runs the workloads of CPU_WORKLOADS only (an epoch of the wider MLPs takes minutes on a CPU).
fastnn's modules are byte-compiled first (`compileall`), as `pip install` does: a checkout run under
PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module from source in every process (~20 ms of `import
fastnn` on the CPU machine, more with the GPU engines). `--dry-run` runs the harness on the CPU with tiny fake data:
the NumPy engine only, the GPU contenders listed as not run.

    python benchmarks/bench_setup.py --data /path/to/fashion-mnist --out setup.md
    python benchmarks/bench_setup.py --data /path/to/fashion-mnist --fit-evaluate --out first_evaluate.md
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = [
    "CONTENDERS", "FE_MODES", "FE_PHASES", "MODES", "PHASES", "WORKLOADS", "fit_evaluate_markdown", "markdown",
    "phases", "run", "run_fit_evaluate",
]  # fmt: skip

#: fastnn's engines (auto, cpu, graph, fused, grid) and the peers' end to end where installed (JAX as most people
#: write it, default precision: `--jax` picks another configuration).
CONTENDERS = (
    "numpy-cpu", "fastnn-mixed", "fastnn-graph", "fastnn-fused", "fastnn-grid", "torch-graph-amp", "jax-default"
)  # fmt: skip
WORKLOADS = ("logreg", "mlp-128", "mlp-1024", "mlp-8192")
CPU_WORKLOADS = ("logreg", "mlp-128")
MODES = ("cold", "warm", "warm again")
PHASES = ("whole process", "python start", "import", "dataset load", "set-up + first epoch", "of which training")
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fastnn-setup-cache"
#: --fit-evaluate: the modes (one fresh process each) and what each of its two rounds times.
FE_MODES = ("cold", "warm")
FE_PHASES = ("trainer", "fit", "evaluate", "close")


def phases(row: dict[str, Any]) -> dict[str, float | None]:
    """The table's seconds of one worker result (None where it has no such mark)."""
    m = row.get("marks", {})

    def span(a: str, b: str) -> float | None:
        return m[b] - m[a] if a in m and b in m else None

    return {
        "whole process": row.get("process_seconds"),
        "python start": m.get("process_start"),
        "import": span("process_start", "imported"),
        "dataset load": span("harness_ready" if "harness_ready" in m else "imported", "data_loaded"),
        "set-up + first epoch": span("data_loaded", "trained"),
        "of which training": row.get("train_seconds"),
    }


def _installed(family: str) -> str | None:
    """Why `family`'s library cannot run here (None when it can)."""
    module = {"torch": "torch", "jax": "jax"}.get(family)
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def byte_compile() -> Path:
    """fastnn's package byte-compiled into its __pycache__ (what an installed copy has); its folder."""
    spec = importlib.util.find_spec("fastnn")
    folder = Path(spec.origin).parent  # type: ignore[union-attr, arg-type]
    compileall.compile_dir(str(folder), quiet=1)
    return folder


def run(args: argparse.Namespace, log: Any = print) -> list[dict[str, Any]]:
    """Every (contender, workload) cold, warm and warm again; one row per run (or one 'skipped' row per pair)."""
    import end_to_end

    byte_compile()
    from workloads import CONTENDERS as KNOWN

    by_name = {c.name: c for c in KNOWN}
    unknown = [n for n in args.only + args.workloads if n not in by_name and n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown contender or workload {', '.join(unknown)}; contenders: {', '.join(by_name)}; "
                         f"workloads: {', '.join(WORKLOADS)}")  # fmt: skip
    cache_root = Path(args.cache_dir)
    rows = []
    for name in args.only:
        contender = by_name[name]
        for wname in args.workloads:
            base = {"contender": name, "family": contender.family, "workload": wname}
            why = _installed(contender.family)
            if args.dry_run and contender.family != "numpy":
                why = "not run: the dry run has no GPU"
            elif contender.family == "numpy" and wname not in CPU_WORKLOADS:
                why = f"not run: the CPU engine runs {', '.join(CPU_WORKLOADS)} only"
            if why:
                rows.append({**base, "mode": None, "status": "skipped", "error": why})
                log(f"{wname:9} {name:16} {why}", flush=True)
                continue
            shutil.rmtree(cache_root / name / wname, ignore_errors=True)
            for mode in MODES:
                # "warm" in end_to_end's terms: the same cache folders every time, JAX's persistent cache on.
                env = end_to_end.cache_env(contender, wname, "warm", cache_root, dict(os.environ))
                res = end_to_end._spawn(contender, wname, env, args, epochs=1, evaluate=False)
                row = {**base, "mode": mode, **res}
                rows.append(row)
                if row["status"] == "ok":
                    p = phases(row)
                    log(f"{wname:9} {name:16} {mode:10} whole {p['whole process']:.2f} s, import {p['import']:.2f}, "
                        f"data {p['dataset load']:.2f}, set-up + epoch {p['set-up + first epoch']:.2f} "
                        f"(training {p['of which training']:.3f})", flush=True)  # fmt: skip
                else:
                    log(f"{wname:9} {name:16} {mode:10} {row['status']}: {row.get('error', '')[-300:]}", flush=True)
    return rows


# ---- --fit-evaluate (issue 41): the first fit + evaluate of a process against the second ------------------------


def fit_evaluate_worker(argv: list[str]) -> int:
    """In this fresh process, twice: a Trainer, fit(epochs=1), evaluate(--eval-rows test rows), close; writes the
    seconds of each step of each round as JSON to --out."""
    p = argparse.ArgumentParser()
    p.add_argument("--fit-evaluate-worker", action="store_true")
    for name in ("--contender", "--workload", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--data")
    p.add_argument("--eval-rows", type=int, default=10_000)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    import end_to_end
    from fastnn_contenders import make_trainer
    from workloads import CONTENDERS as KNOWN
    from workloads import build_workloads, load_data

    contender = next(c for c in KNOWN if c.name == args.contender)
    w = next(x for x in build_workloads(False) if x.name == args.workload)
    if args.tiny:
        w = end_to_end._tiny(w)
    data = end_to_end._fake_data(w.samples) if args.tiny else load_data(args.data)
    x, y = data[0][: w.samples], data[1][: w.samples]
    xt, yt = data[2][: args.eval_rows], data[3][: args.eval_rows]
    rounds, engine = [], None
    for _ in range(2):
        marks = [time.perf_counter()]
        trainer = make_trainer(contender, w, check_init=False)
        marks.append(time.perf_counter())
        trainer.fit(x, y, epochs=1, progress=False)
        marks.append(time.perf_counter())
        accuracy = trainer.evaluate(xt, yt)["accuracy"]
        marks.append(time.perf_counter())
        engine = trainer.engine
        trainer.close()
        marks.append(time.perf_counter())
        rounds.append({**{k: b - a for k, a, b in zip(FE_PHASES, marks, marks[1:])}, "accuracy": accuracy})
    Path(args.out).write_text(json.dumps({"status": "ok", "engine": engine, "rounds": rounds}))
    return 0


def run_fit_evaluate(args: argparse.Namespace, log: Any = print) -> list[dict[str, Any]]:
    """Every fastnn (contender, workload): one fresh process cold, one warm; one row per process."""
    byte_compile()
    from workloads import CONTENDERS as KNOWN

    by_name = {c.name: c for c in KNOWN}
    rows = []
    for name in args.only:
        contender = by_name[name]
        for wname in args.workloads:
            base = {"contender": name, "workload": wname}
            why = None
            if contender.family not in ("fastnn", "numpy"):
                why = "not run: fastnn's engines only"
            elif args.dry_run and contender.family != "numpy":
                why = "not run: the dry run has no GPU"
            elif contender.family == "numpy" and wname not in CPU_WORKLOADS:
                why = f"not run: the CPU engine runs {', '.join(CPU_WORKLOADS)} only"
            if why:
                rows.append({**base, "mode": None, "status": "skipped", "error": why})
                continue
            shutil.rmtree(Path(args.cache_dir) / name / wname, ignore_errors=True)
            for mode in FE_MODES:
                row = {**base, "mode": mode, **_spawn_fit_evaluate(contender, wname, args)}
                rows.append(row)
                if row["status"] == "ok":
                    (a, b) = row["rounds"]
                    log(f"{wname:9} {name:16} {mode:5} first fit {a['fit']:.3f} s evaluate {a['evaluate']:.3f}; "
                        f"second fit {b['fit']:.3f} evaluate {b['evaluate']:.3f}", flush=True)  # fmt: skip
                else:
                    log(f"{wname:9} {name:16} {mode:5} {row['status']}: {row.get('error', '')[-300:]}", flush=True)
    return rows


def _spawn_fit_evaluate(contender: Any, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    import end_to_end

    env = end_to_end.cache_env(contender, workload, "warm", Path(args.cache_dir), dict(os.environ))
    with tempfile.TemporaryDirectory(prefix="fastnn-fe-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--fit-evaluate-worker", "--contender", contender.name,
               "--workload", workload, "--out", str(out), "--eval-rows", str(args.eval_rows)]  # fmt: skip
        if args.data:
            cmd += ["--data", args.data]
        if args.dry_run:
            cmd.append("--tiny")
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            why = f"worker exit {res.returncode}: {(res.stdout + res.stderr)[-1500:]}"
        except subprocess.TimeoutExpired:
            why = f"worker timed out after {args.timeout:.0f} s"
        if out.exists():
            return json.loads(out.read_text())
    if "Unavailable" in why:
        return {"status": "unavailable", "error": why.strip().splitlines()[-1][-300:]}
    return {"status": "error", "error": why[-800:]}


def fit_evaluate_markdown(rows: list[dict[str, Any]], device: str, note: str = "") -> str:
    """One line per (workload, contender, mode): each round's fit and evaluate, and the first round's fit + evaluate
    over the second's (issue 41's target: within 10%)."""
    out = [f"# The first fit + evaluate of a process against the second ({device})", ""]
    if note:
        out += [note, ""]
    out += ["Fresh process per row; twice in it: Trainer, fit(epochs=1), evaluate (test rows), close. Seconds.", "",
            "| workload | contender | mode | engine | 1st Trainer | 1st fit | 1st evaluate | 2nd Trainer | 2nd fit | "
            "2nd evaluate | 1st / 2nd fit + evaluate |", "|---|---|---|---|" + "---:|" * 7]  # fmt: skip
    for r in rows:
        head = f"| {r['workload']} | {r['contender']} | {r['mode'] or '-'} |"
        if r["status"] != "ok":
            out.append(f"{head} - | {r['status']}: {r.get('error', '')[-120:]} |" + " |" * 6)
            continue
        a, b = r["rounds"]
        ratio = (a["fit"] + a["evaluate"]) / max(b["fit"] + b["evaluate"], 1e-9)
        cells = [_seconds(v) for v in (a["trainer"], a["fit"], a["evaluate"], b["trainer"], b["fit"], b["evaluate"])]
        out.append(f"{head} {r['engine']} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return "\n".join(out) + "\n"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def markdown(rows: list[dict[str, Any]], device: str, note: str = "") -> str:
    """The summary (whole process per mode) and one phase table per (workload, contender)."""
    pairs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        pairs.setdefault((r["workload"], r["contender"]), {})[r["mode"] or "skipped"] = r
    out = [f"# From `python` to a trained model: set-up cost ({device})", ""]
    if note:
        out += [note, ""]
    out += ["Fresh processes, one epoch; cold: empty kernel, autotuning, decoded-dataset and JAX caches; warm: "
            "filled by the run before; fastnn byte-compiled as pip installs it. Seconds.", "",
            "| workload | contender | " + " | ".join(MODES) + " | training (warm) |",
            "|---|---|" + "---:|" * (len(MODES) + 1)]  # fmt: skip
    for (w, c), by_mode in pairs.items():
        if "skipped" in by_mode:
            out.append(f"| {w} | {c} | " + " | ".join(["n/a"] * len(MODES)) + f" | {by_mode['skipped']['error']} |")
            continue
        cells = [_seconds(phases(by_mode[m])["whole process"]) if by_mode.get(m, {}).get("status") == "ok"
                 else by_mode.get(m, {}).get("status", "-") for m in MODES]  # fmt: skip
        warm = by_mode.get("warm", {})
        train = _seconds(phases(warm)["of which training"]) if warm.get("status") == "ok" else "-"
        out.append(f"| {w} | {c} | " + " | ".join(cells) + f" | {train} |")
    for (w, c), by_mode in pairs.items():
        if "skipped" in by_mode:
            continue
        out += ["", f"### {w} · {c}", "", "| | " + " | ".join(MODES) + " |", "|---|" + "---:|" * len(MODES)]
        for phase in PHASES:
            cells = [_seconds(phases(by_mode[m])[phase]) if by_mode.get(m, {}).get("status") == "ok" else "-"
                     for m in MODES]  # fmt: skip
            out.append(f"| {phase} | " + " | ".join(cells) + " |")
        errors = [f"{m}: {by_mode[m].get('error', '')[-200:]}" for m in MODES if by_mode.get(m, {}).get("status")
                  not in (None, "ok")]  # fmt: skip
        out += [f"\n{e}" for e in errors]
    return "\n".join(out) + "\n"


def _device() -> str:
    try:
        from fastnn.cuda import driver

        return driver.device_name(0)
    except Exception as exc:  # no driver, no GPU: the table says so instead of failing
        return f"no GPU ({type(exc).__name__})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the markdown table's file (the rows go to the same name .json)")
    p.add_argument("--data", help="the Fashion-MNIST folder (default: where fastnn.datasets looks)")
    p.add_argument("--only", default=",".join(CONTENDERS), help="contenders, comma-separated")
    p.add_argument("--jax", help="the JAX configuration to run instead of jax-default (e.g. jax-amp)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="workloads, comma-separated")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="cache folders (emptied before each cold run)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a worker is given up")
    p.add_argument("--dry-run", action="store_true", help="the CPU engine on tiny fake data; GPU contenders listed")
    p.add_argument("--fit-evaluate", action="store_true",
                   help="time the first and second Trainer + fit + evaluate of a process instead (issue 41)")
    p.add_argument("--eval-rows", type=int, default=10_000, help="--fit-evaluate: test rows evaluated")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.jax:
        args.only = [args.jax if n == "jax-default" else n for n in args.only]
    args.workloads = [s.strip() for s in args.workloads.split(",") if s.strip()]
    args.quick, args.tiny = False, args.dry_run  # end_to_end._spawn's arguments
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--fit-evaluate-worker" in argv:
        return fit_evaluate_worker(argv)
    args = parse_args(argv)
    started = time.time()
    rows = run_fit_evaluate(args) if args.fit_evaluate else run(args)
    device = "CPU dry run, tiny fake data" if args.dry_run else _device()
    note = f"Measured {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} by benchmarks/bench_setup.py."
    out = Path(args.out)
    out.write_text((fit_evaluate_markdown if args.fit_evaluate else markdown)(rows, device, note))
    out.with_suffix(".json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return int(any(r["status"] == "error" for r in rows))


if __name__ == "__main__":
    raise SystemExit(main())
