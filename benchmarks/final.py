"""The published run (issue 44) as device calls of under 10 minutes each, and the step that publishes it.

    python benchmarks/final.py --list                       # the calls, what each runs, its estimate
    python benchmarks/final.py --call N [--data DIR]        # on the GPU machine: call N (one device call each)
    python benchmarks/final.py --publish                    # on any machine: merge, tables, graphs, README/docs

Every call writes under benchmarks/results/raw/ (git ignores it) and, where `$OUT` is set (the device's
folder that comes back), copies that folder there, so the calls can run on fresh machines: carry the raw
folder to the next call and back to the checkout that publishes (README "The published run"). Each command of a
call runs under `timeout` (CALL_LIMIT_S in all), so a call ends inside the device's 10 minutes and keeps what it
measured (bench_mnist.py saves after every row; bench_many.py runs once per K, one file each).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from workloads import FLAG_WORKLOADS, GRID_HIDDEN, batch_grid, build_workloads  # noqa: E402

__all__ = [
    "CALLS",
    "CALL_LIMIT_S",
    "FINAL",
    "MANY_DIR",
    "PEERS",
    "SCALING_DIR",
    "Call",
    "expected_cells",
    "planned_training",
    "main",
    "many_plan",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")
#: Where bench_many.py's and bench_scaling.py's JSON go (report.py reads every file there).
MANY_DIR = "raw/many"
SCALING_DIR = "raw/scaling"
SETUP_DIR = "raw/setup"
#: The longest a call's commands may run together: the device allows 600 s a command; the rest is start-up and copy.
CALL_LIMIT_S = 560
#: A command is not started with less than this left of its call (none of them does anything useful in less).
MIN_LEFT_S = 30.0

#: The contenders that can be the fastest peer (issue 27), run with fastnn in one call so that every workload's
#: best peer and fastnn's ratio over it come from the same call: JAX as most people write it (default precision:
#: TF32 on Hopper), AMP-like and fp32 HIGHEST; PyTorch's whole-step CUDA graph with AMP and with TF32.
PEERS = ("jax-default", "jax-amp", "jax-fp32", "torch-graph-amp", "torch-graph-tf32")
_ENGINE_PRECISIONS = ",".join(f"fastnn-{e}-{p}" for e in ("graph", "fused", "grid") for p in ("fp16", "fp32"))
_MAIN = {w.name for w in build_workloads(quick=False)}
_GRID_NEW = [w for w in batch_grid() if w.name not in _MAIN]  # mlp-1024-b128 is in call 1 already


def _grid(hidden: tuple[int, ...]) -> str:
    return ",".join(w.name for w in _GRID_NEW if w.hidden in hidden)


#: bench_mnist.py's `--final N` presets. Call 1 alone makes the headline (`report.py --publish`); later calls repeat
#: fastnn-mixed on their workloads as drift repeats, so each of their speedups compares rows of one call and the
#: drift between calls shows. The end-to-end and time-to-accuracy calls pick jax-best from the JAX rows already in
#: the output folder (call 1's).
FINAL: dict[str, tuple[list[str], str]] = {
    "1": (
        ["--only", ",".join(("fastnn-mixed", "fastnn-graph", "fastnn-fused", "fastnn-grid", *PEERS))],
        "fastnn (auto, graph, fused, grid) and the peers that can be fastest, every workload: the headline (~6 min)",
    ),
    "2": (
        [
            "--only",
            "fastnn-fp16,fastnn-fp32,numpy-cpu,torch-graph-fp32,torch-eager-fp32,fastnn-mixed",
            "--drift",
            "fastnn-mixed",
        ],  # fmt: skip
        "fastnn fp16/fp32, NumPy, PyTorch CUDA graph fp32 and eager fp32 + the drift repeat (~7 min)",
    ),
    "3": (
        ["--only", "torch-eager-amp,torch-compile-default-amp,fastnn-mixed", "--drift", "fastnn-mixed"],
        "PyTorch eager AMP and torch.compile default mode, every workload + the drift repeat (~7 min)",
    ),
    "4": (
        [
            "--only",
            "torch-compile-amp,jax-fp32-cmdbuf,jax-fp32-nocmdbuf,fastnn-mixed",
            "--drift",
            "fastnn-mixed",
            "--only-workload",
            ",".join(FLAG_WORKLOADS),
        ],  # fmt: skip
        'torch.compile(mode="max-autotune", fullgraph=True) and the XLA flag variants on '
        + ", ".join(FLAG_WORKLOADS)
        + " (~6 min; ~52 s of compilation a width)",
    ),
    "5": (["--no-train", "--e2e"], "end to end cold/warm, jax-best from the folder's JAX rows (~5 min)"),
    "6": (["--no-train", "--tta"], "time to accuracy: logreg to 0.84, MLP-128 to 0.88, MLP-256 to 0.89 (~6 min)"),
    "7": (
        ["--only", _ENGINE_PRECISIONS + ",fastnn-mixed", "--drift", "fastnn-mixed"],
        "each fastnn engine in fp16 and fp32 (refusals are rows saying why) + the drift repeat (~5 min)",
    ),
    "8": (
        ["--only", ",".join(("fastnn-mixed", "fastnn-graph", *PEERS)), "--only-workload", _grid((256, 1024))],
        "the batch grid at h = 256 and 1024 (batch 64-512), fastnn and the fastest peers (~5 min)",
    ),
    "9": (
        ["--only", ",".join(("fastnn-mixed", "fastnn-graph", *PEERS)), "--only-workload", _grid((4096,))],
        "the batch grid at h = 4096 (batch 64-512), fastnn and the fastest peers (~6 min)",
    ),
}
assert {w.hidden for w in _GRID_NEW} == set(GRID_HIDDEN)


@dataclass(frozen=True)
class Call:
    """One device call: the commands it runs (argv lists, relative to the repository), what for, the GPUs."""

    about: str
    commands: tuple[tuple[str, ...], ...]
    gpus: int = 1


def _mnist(n: str) -> Call:
    cmd = ("benchmarks/bench_mnist.py", "--final", n, "--out", str(RESULTS), "--no-merge", "--timeout", "200")
    return Call(FINAL[n][1], (cmd,))


def _many(workload: str, ks: tuple[int, ...]) -> Call:
    cmds = tuple(("benchmarks/bench_many.py", "--workloads", workload, "--ks", str(k),
                  "--out", str(RESULTS / MANY_DIR / f"{workload}-k{k}.json")) for k in ks)  # fmt: skip
    return Call(f"many models at once, {workload}, K = {', '.join(map(str, ks))}: fastnn, JAX vmap, torch.func "
                "(one bench_many.py per K)", cmds)  # fmt: skip


#: bench_setup.py (issue 26): a fresh process to one trained epoch, cold, warm and warm again, in two calls.
SETUP_FASTNN = ("numpy-cpu", "fastnn-mixed", "fastnn-graph", "fastnn-fused", "fastnn-grid")
SETUP_PEERS = ("torch-graph-amp", "jax-default")
SETUP_WORKLOADS = ("logreg", "mlp-128", "mlp-1024", "mlp-8192")
SETUP_CPU_WORKLOADS = ("logreg", "mlp-128")  # bench_setup.CPU_WORKLOADS: the NumPy engine's
SETUP_MODES = ("cold", "warm", "warm again")


def _setup(tag: str, contenders: tuple[str, ...]) -> Call:
    cmd = ("benchmarks/bench_setup.py", "--only", ",".join(contenders), "--workloads", ",".join(SETUP_WORKLOADS),
           "--out", str(RESULTS / SETUP_DIR / f"setup-{tag}.md"))  # fmt: skip
    return Call(f"a fresh process to one trained epoch, cold/warm/warm again: {', '.join(contenders)} (~4 min)", (cmd,))


CALLS: dict[str, Call] = {
    **{n: _mnist(n) for n in FINAL},
    "10": _many("logreg", (1, 32, 128, 1024)),
    "11": _many("mlp-128", (1, 32, 128)),
    "12": Call(
        "2-GPU data-parallel scaling (nvidia-h100-x2): samples/s of 1 and 2 GPUs, processes and devices=2",
        (("benchmarks/bench_scaling.py", "--worlds", "1,2", "--json", str(RESULTS / SCALING_DIR / "scaling.json")),),
        gpus=2,
    ),
    "13": _setup("fastnn", SETUP_FASTNN),
    "14": _setup("peers", SETUP_PEERS),
}


#: bench_scaling.py's runs at --worlds 1,2 (its default knobs), each workload.
SCALING_RUNS = ("1 GPU, no group", "2 GPUs, ceiling", "1 GPU, NCCL group", "2 GPUs, NCCL group", "2 GPUs, devices=2")
SCALING_WORKLOADS = ("mlp4096", "logreg", "mlp128")
#: The rows bench_many.py's default contenders (fastnn, fastnn-fold, jax, torch) write on a GPU, by the names its
#: results carry (many_contenders: Result.contender).
MANY_CONTENDERS = ("fastnn", "fastnn-fold", "jax-vmap", "torch-func-graphs")


def many_plan() -> list[tuple[str, int, str]]:
    """(workload, K, contender) of every many-model row the calls make."""
    out = []
    for call in CALLS.values():
        for cmd in call.commands:
            if cmd[0].endswith("bench_many.py"):
                w, k = cmd[cmd.index("--workloads") + 1], int(cmd[cmd.index("--ks") + 1])
                out += [(w, k, c) for c in MANY_CONTENDERS]
    return out


def expected_cells() -> dict[str, list[tuple[str, str, str]]]:
    """Per table (train, e2e, tta, many, scaling, setup): the (workload, contender, mode) cells the final run makes."""
    from end_to_end import E2E_CONTENDERS, E2E_WORKLOADS, MODES, TTA_CONTENDERS, TTA_WORKLOADS
    from workloads import select

    train: list[tuple[str, str, str]] = []
    for args, _ in FINAL.values():
        if "--no-train" in args:
            continue
        only = args[args.index("--only") + 1]
        only_w = args[args.index("--only-workload") + 1] if "--only-workload" in args else None
        contenders, workloads = select(only, only_w, skip_compile=False, quick=False)
        for w in workloads:
            for c in contenders:
                if not (c.logreg_only and w.name != "logreg") and (c.workloads is None or w.name in c.workloads):
                    train.append((w.name, c.name, ""))
    return {
        "train": list(dict.fromkeys(train)),
        "e2e": [(w, c, m) for c in E2E_CONTENDERS for w in E2E_WORKLOADS for m in MODES],
        "tta": [(w, c, "") for c in TTA_CONTENDERS for w in TTA_WORKLOADS],
        "many": [(f"{w} K={k}", c, "") for w, k, c in many_plan()],
        "scaling": [(w, r, "") for w in SCALING_WORKLOADS for r in SCALING_RUNS],
        "setup": [(w, c, m) for c in SETUP_FASTNN + SETUP_PEERS for w in SETUP_WORKLOADS for m in SETUP_MODES
                  if c != "numpy-cpu" or w in SETUP_CPU_WORKLOADS],  # fmt: skip
    }


@functools.cache
def planned_training() -> frozenset[tuple[str, str]]:
    """(workload, contender) of every training row the final run makes."""
    return frozenset((w, c) for w, c, _ in expected_cells()["train"])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (started with start_new_session=True)."""
    with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
        os.killpg(proc.pid, signal.SIGKILL)


def run_call(name: str, data: str, limit_s: float, copy_to: str | None) -> int:
    """Run call `name`'s commands (the data folder added), each under what is left of `limit_s`; record them."""
    call = CALLS[name]
    raw = REPO / RESULTS / "raw"
    log_path = raw / f"call{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    record = {"call": name, "about": call.about, "started": start, "commands": []}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    rc = 0
    with log_path.open("a") as log:
        for cmd in call.commands:
            left = limit_s - (time.time() - start)
            argv = [sys.executable, *cmd, "--data", data]
            if left < MIN_LEFT_S:
                record["commands"].append({"argv": argv, "rc": None, "why": "no time left in this call"})
                rc = rc or 124
                continue
            print("$ " + shlex.join(argv), flush=True)
            log.write("$ " + shlex.join(argv) + "\n")
            log.flush()
            # a session of its own: at the limit the whole group goes (JAX subprocesses and fresh-process workers
            # included, which would otherwise hold the output pipe open); what it saved so far stays
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)  # fmt: skip
            timer = threading.Timer(left, _kill_group, (proc,))
            timer.start()
            for line in proc.stdout:  # type: ignore[union-attr]
                sys.stdout.write(line)
                log.write(line)
            code = proc.wait()
            timer.cancel()
            if time.time() - start >= limit_s:
                code = 124
            record["commands"].append({"argv": argv, "rc": code, "seconds": round(time.time() - start, 1)})
            rc = rc or code
    record.update(finished=time.time(), rc=rc)
    calls_path = raw / "calls.json"
    done = json.loads(calls_path.read_text()) if calls_path.exists() else []
    calls_path.write_text(json.dumps([*done, record], indent=1) + "\n")
    if copy_to:
        shutil.copytree(raw, Path(copy_to) / "raw", dirs_exist_ok=True)
        print(f"copied {raw} to {copy_to}/raw")
    return rc


def publish() -> int:
    """Merge every raw result into bench.md, bench_summary.json and the graphs, then the README's and docs' blocks."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for cmd in (["benchmarks/bench_mnist.py", "--out", str(RESULTS), "--merge"],
                ["benchmarks/report.py", "--publish", str(RESULTS)]):  # fmt: skip
        print("$ " + shlex.join(cmd), flush=True)
        if subprocess.run([sys.executable, *cmd], cwd=REPO, env=env).returncode:
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the calls")
    mode.add_argument("--call", choices=list(CALLS), help="run one call (on the GPU machine)")
    mode.add_argument("--publish", action="store_true", help="merge the raw results and rewrite the pages")
    p.add_argument("--data", default=".data/fashion-mnist", help="Fashion-MNIST's IDX files")
    p.add_argument("--limit", type=float, default=CALL_LIMIT_S, help="seconds for the whole call")
    p.add_argument("--copy-to", default=os.environ.get("OUT"), help="copy raw/ here at the end (default: $OUT)")
    args = p.parse_args(argv)
    if args.list:
        for name, call in CALLS.items():
            print(f"call {name:>2} ({call.gpus} GPU{'s' if call.gpus > 1 else ''}): {call.about}")
            for cmd in call.commands:
                print(f"         {shlex.join(cmd)}")
        return 0
    if args.publish:
        return publish()
    return run_call(args.call, args.data, args.limit, args.copy_to)


if __name__ == "__main__":
    raise SystemExit(main())
