"""The benchmark harness on the CPU: the dry run (a subprocess, no GPU, no torch), the plan's arithmetic, the
report and graphs from synthetic rows, and (where torch is installed) PyTorch's step matching fastnn's NumPy engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import workloads as wl  # noqa: E402

from fastnn.shuffle import permutation  # noqa: E402


def run_bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(BENCH / "bench_mnist.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_builds_the_whole_plan_without_torch():
    res = run_bench("--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    # 8 workloads x 14 GPU contenders (fastnn x5, torch x5, jax x4) + numpy-cpu on logreg
    assert "pairs: 113" in out
    assert "torch imported: False" in out
    for h in wl.HIDDEN_FULL:
        assert f"mlp-{h} " in out
    for name in ("fastnn-mixed", "fastnn-fp16", "fastnn-fp32", "numpy-cpu"):
        assert f"logreg    {name}" in out and "trainer ok on cpu" in out
    assert out.count("trainer ok on cpu") == 4 + 3 * 3  # logreg (4) and mlp-128/256/512 (3 each) are built
    assert "9380 steps" in out and "5000 steps" in out


def test_dry_run_quick_with_filters():
    res = run_bench("--dry-run", "--quick", "--only", "fastnn-mixed,torch", "--only-workload", "logreg,mlp-1024")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "pairs: 12" in out  # 2 workloads x (fastnn-mixed + 5 torch contenders)
    assert "mlp-128 " not in out and "fastnn-fp32" not in out and "numpy-cpu" not in out
    assert "3 x 469 steps" in out and "1 x 1000 steps" in out


def test_skip_compile_and_unknown_names():
    contenders, _ = wl.select("torch", None, skip_compile=True, quick=True)
    names = [c.name for c in contenders]
    assert names == ["torch-eager-fp32", "torch-eager-amp", "torch-graph-fp32", "torch-graph-amp"]
    res = run_bench("--dry-run", "--only", "fastnn-mixed,nope")
    assert res.returncode != 0 and "nope" in res.stderr
    res = run_bench("--dry-run", "--only-workload", "mlp-3")
    assert res.returncode != 0 and "mlp-3" in res.stderr


def test_workload_arithmetic():
    full = {w.name: w for w in wl.build_workloads(quick=False)}
    logreg = full["logreg"]
    assert logreg.steps_per_epoch == 469 and logreg.steps == 9380
    assert sum(logreg.batch_sizes()) == 60_000 and logreg.batch_sizes()[-1] == 96
    for h in wl.HIDDEN_FULL:
        w = full[f"mlp-{h}"]
        assert w.steps == 5000 and set(w.batch_sizes()) == {32} and w.sizes == (784, h, h, h, 10)
    quick = {w.name for w in wl.build_workloads(quick=True)}
    assert quick == {"logreg", "mlp-128", "mlp-1024"}


def test_epoch_orders_are_fastnns_shuffle():
    w = wl.Workload("t", (784, 10), lr=0.1, batch_size=8, samples=50, epochs=3)
    orders = wl.epoch_orders(w, wl.FIRST_TIMED_EPOCH, w.epochs)
    assert orders.shape == (3, 50) and orders.dtype == np.int64
    for e in range(3):
        np.testing.assert_array_equal(orders[e], permutation(wl.SEED, wl.FIRST_TIMED_EPOCH + e, 50))
    assert not np.array_equal(orders[0], orders[1])


def _row(workload: str, contender: str, seconds: float, run_id: str = "r1", **extra) -> dict:
    c = next(c for c in wl.CONTENDERS if c.name == contender)
    row = {
        "workload": workload,
        "contender": contender,
        "family": c.family,
        "precision": c.precision,
        "kind": c.kind,
        "description": c.description,
        "hidden": None if workload == "logreg" else int(workload.split("-")[1]),
        "run_id": run_id,
        "status": "ok",
        "train_seconds": seconds,
        "seconds_per_step": seconds / 100,
        "seconds_per_epoch": seconds / 2,
        "setup_seconds": 1.0,
        "epoch_losses": [1.0, 0.5],
        "final_train_loss": 0.5,
        "test_accuracy": 0.8,
        "peak_memory_bytes": 3 << 20,
    }
    row.update(extra)
    return row


def _partial(tmp: Path, run_id: str, started: float, rows: list[dict]) -> None:
    plans = {w.name: wl.plan_dict(w) for w in wl.build_workloads(quick=True)}
    doc = {
        "schema": 1,
        "run": {"run_id": run_id, "started": started, "finished": started + 1, "args": {}, "argv": []},
        "environment": {"device": f"GPU of {run_id}", "date": "today"},
        "workloads": plans,
        "rows": rows,
    }
    wl.write_json(tmp / "partial" / f"{run_id}.json", doc)


def test_merge_speedups_and_markdown(tmp_path):
    import report

    _partial(
        tmp_path,
        "r1",
        1.0,
        [
            _row("logreg", "fastnn-mixed", 1.0, "r1"),
            _row("logreg", "fastnn-fp32", 2.0, "r1"),
            _row("logreg", "torch-eager-fp32", 9.0, "r1"),
            _row("logreg", "torch-eager-amp", 5.0, "r1"),
        ],
    )
    _partial(
        tmp_path,
        "r2",
        2.0,
        [
            _row("logreg", "torch-eager-fp32", 8.0, "r2"),  # replaces r1's row
            _row("logreg", "numpy-cpu", 40.0, "r2", scaled=True),
            {**_row("mlp-128", "torch-graph-amp", 1.0, "r2"), "status": "error", "error": "RuntimeError: boom"},
        ],
    )
    doc = report.write_outputs(tmp_path, plots=False)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["rows"] == doc["rows"] and saved["environment"]["device"] == "GPU of r2"
    rows = {(r["workload"], r["contender"]): r for r in doc["rows"]}
    assert len(rows) == 6 and rows[("logreg", "torch-eager-fp32")]["train_seconds"] == 8.0
    fp32 = rows[("logreg", "torch-eager-fp32")]
    assert fp32["speedup_fastnn_mixed"] == pytest.approx(8.0) and fp32["speedup_fastnn_mixed_same_run"] is False
    assert fp32["speedup_fastnn_matched"] == pytest.approx(4.0) and fp32["speedup_fastnn_matched_ref"] == "fastnn-fp32"
    assert rows[("logreg", "torch-eager-amp")]["speedup_fastnn_matched"] == pytest.approx(5.0)
    assert rows[("logreg", "numpy-cpu")]["speedup_fastnn_mixed"] == pytest.approx(40.0)
    assert rows[("mlp-128", "torch-graph-amp")]["speedup_fastnn_mixed"] is None
    md = (tmp_path / "bench.md").read_text()
    assert "| torch-eager-fp32 | 8 |" in md  # the time table, logreg column
    assert "| torch-eager-fp32 | 8.00x |" in md  # the speedup table
    assert "40*" in md and "scaled from fewer epochs" in md
    assert "RuntimeError: boom" in md and "GPU of r2" in md
    assert [c for c in ("fastnn-mixed", "torch-eager-amp", "numpy-cpu") if f"`{c}`" not in md] == []


def test_merge_refuses_quick_and_full_runs_together(tmp_path):
    import report

    with pytest.raises(SystemExit, match="no partial results"):
        report.write_outputs(tmp_path, plots=False)
    _partial(tmp_path, "r1", 1.0, [_row("logreg", "fastnn-mixed", 1.0, "r1")])
    full = {w.name: wl.plan_dict(w) for w in wl.build_workloads(quick=False)}
    doc = json.loads((tmp_path / "partial" / "r1.json").read_text())
    doc.update(run=dict(doc["run"], run_id="r2", started=2.0), workloads=full)
    wl.write_json(tmp_path / "partial" / "r2.json", doc)
    with pytest.raises(SystemExit, match="separate --out"):
        report.write_outputs(tmp_path, plots=False)


def test_graphs_are_written(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'bench' extra) draws the graphs")
    import plots
    import report

    rows = []
    for h in (128, 1024):
        for c, t in (("fastnn-mixed", 0.1), ("torch-eager-amp", 1.0), ("torch-graph-amp", 0.3)):
            rows.append(_row(f"mlp-{h}", c, t * h / 128, step_losses=list(np.linspace(2.0, 0.5, 2000))))
    rows.append(_row("logreg", "fastnn-mixed", 0.2))
    rows.append(_row("logreg", "torch-eager-amp", 2.0, step_losses=list(np.linspace(2.0, 0.4, 3 * 469))))
    _partial(tmp_path, "r1", 1.0, rows)
    report.write_outputs(tmp_path, plots=False)
    assert plots.main([str(tmp_path)]) == 0
    for name in ("time_graph.png", "loss_graph.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_torch_eager_matches_the_numpy_engine():
    """PyTorch's eager step, on the CPU, from the same weights and in the same order: the same losses as fastnn."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0 to run this)")
    import fastnn_contenders
    import torch_contenders

    rng = np.random.default_rng(1)
    n = 100  # batch 32: three full batches and a short one of 4
    data = (
        rng.integers(0, 256, size=(n, 784), dtype=np.uint8),
        rng.integers(0, 10, size=n).astype(np.int64),
        rng.integers(0, 256, size=(40, 784), dtype=np.uint8),
        rng.integers(0, 10, size=40).astype(np.int64),
    )
    w = wl.Workload("t", (784, 24, 16, 10), lr=0.05, batch_size=32, samples=n, epochs=2)
    contenders = {c.name: c for c in wl.CONTENDERS}
    ref = fastnn_contenders.run_fastnn(contenders["numpy-cpu"], w, data, cpu_budget_s=1e9)
    got = torch_contenders.run_torch(contenders["torch-eager-fp32"], w, data, device="cpu", record_steps=True)
    assert ref["measured_epochs"] == 2 and not ref["scaled"]
    np.testing.assert_allclose(got["epoch_losses"], ref["epoch_losses"], rtol=1e-5)
    assert got["test_loss"] == pytest.approx(ref["test_loss"], rel=1e-5)
    assert got["test_accuracy"] == pytest.approx(ref["test_accuracy"])
    assert len(got["step_losses"]) == w.steps and got["epoch_losses"][1] < got["epoch_losses"][0]
    # a different order (epoch 0's) gives different losses: the comparison above can fail
    w0 = wl.Workload("t", w.sizes, lr=w.lr, batch_size=w.batch_size, samples=n, epochs=1)
    import torch

    job = torch_contenders._Job(w0, data, torch.device("cpu"), amp=False)
    runner = torch_contenders._Eager(job)
    losses = torch.zeros(w0.steps_per_epoch)
    runner.run_epoch(torch.from_numpy(permutation(wl.SEED, 0, n)), losses)
    assert not np.allclose(losses.numpy(), got["step_losses"][: w0.steps_per_epoch], rtol=1e-5)


def test_torch_model_names_match_fastnn():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch_contenders

    from fastnn import MLP
    from fastnn.model import init_parameters, param_names

    model = torch_contenders.build_model((784, 32, 32, 10), torch.device("cpu"))
    sd = model.state_dict()
    assert list(sd) == param_names(MLP([784, 32, 32, 10]))
    for k, v in init_parameters(MLP([784, 32, 32, 10]), wl.SEED).items():
        np.testing.assert_array_equal(sd[k].numpy(), v)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        contender = next(c for c in wl.CONTENDERS if c.name == "torch-graph-amp")
        torch_contenders.run_torch(contender, wl.build_workloads(True)[0], None, device="cpu")
