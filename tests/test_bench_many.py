"""benchmarks/bench_many.py on the CPU: the dry run prints the plan of every workload and K, trains fastnn's
MultiTrainer on a tiny set, and checks every contender importable here (JAX vmap, torch.func) against it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_dry_run_plans_every_workload_and_checks_the_contenders():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_many.py"), "--dry-run"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    for k in (1, 32, 128, 1024):
        assert f"K={k:5d}" in out
    assert "784-10                 batch  128   469 steps  K= 1024  lr 0.02..1" in out
    assert "784-128-128-128-10     batch   32  1875 steps  K=  128" in out
    assert out.count("fastnn (cpu, K=3): best test accuracy") == 2
    for contender in ("jax", "torch"):
        if importlib.util.find_spec(contender) is not None:
            assert out.count(f"{contender} (cpu, K=3): best test accuracy") == 2
            assert "MISMATCH" not in out
    assert out.rstrip().endswith("dry run ok")


@pytest.mark.bindings
def test_the_kernel_microbenchmark_runs_its_checks_through_the_emulation(monkeypatch):
    """benchmarks/bench_many_kernels.py on the CPU: its launches of the loss and update kernels (both variants, tiles
    of 4 models, two streams of different rows) through tests/_many_emulator.py, its checks passing; the dry run."""
    pytest.importorskip("fastnn.cuda.driver", reason="needs the CUDA wheels")
    from _many_emulator import Heap, make_driver

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_many_kernels

    shape = bench_many_kernels.Shape("tiny", (20, 10), 600, 40, folds=True)  # 600 // 132 SMs: tiles of 4
    us = bench_many_kernels.measure(shape, 2, driver=make_driver(Heap()), cubin=b"emulated")
    assert set(us) == {"loss model", "loss tiled", "update scalar", "update vec4"} and all(t > 0 for t in us.values())
    assert bench_many_kernels.main(["--dry-run"]) == 0
