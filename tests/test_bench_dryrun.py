"""The benchmark harness on the CPU: the dry run (a subprocess, no GPU, no torch), the plan's arithmetic, the
report and graphs from synthetic rows, and (where torch is installed) PyTorch's step matching fastnn's NumPy engine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import workloads as wl  # noqa: E402
from report import PARTIAL_DIR, RAW_DIR  # noqa: E402

from fastnn._shuffle import permutation  # noqa: E402


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
    # 10 workloads x 22 GPU contenders (fastnn x12, torch x7, jax x3) + numpy-cpu on logreg
    assert "pairs: 229" in out  # + the two XLA flag variants on 4 of the 10 workloads
    assert "torch imported: False" in out
    for h in wl.HIDDEN_FULL:
        assert f"mlp-{h} " in out
    for name in ("fastnn-mixed", "fastnn-fp16", "fastnn-fp32", "numpy-cpu"):
        assert f"logreg    {name}" in out and "trainer ok on cpu" in out
    assert out.count("trainer ok on cpu") == 4 + 3 * 3  # logreg (4) and mlp-128/256/512 (3 each) are built
    assert "9380 steps" in out and "5000 steps" in out
    # issue 27: the larger batches at h = 1024, and every contender's settings printed from its definition
    assert "mlp-1024-b128 784-1024-1024-1024-10" in out and "batch 128  samples  32000 epochs 20 x 250 steps" in out
    assert "batch 1024 samples  32000 epochs 40 x 32 steps = 1280 steps" in out
    assert out.count("settings: ") == len(wl.CONTENDERS)
    assert 'whole steps; fp32; torch.set_float32_matmul_precision("high") (TF32)' in out
    assert "settings: torch.compile(mode='default', fullgraph=True, dynamic=False); torch.autocast" in out
    assert "settings: jax.jit(lax.scan) per epoch; fp32, dot without precision= (JAX's default" in out


def test_dry_run_quick_with_filters():
    res = run_bench("--dry-run", "--quick", "--only", "fastnn-mixed,torch", "--only-workload", "logreg,mlp-1024")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "pairs: 16" in out  # 2 workloads x (fastnn-mixed + 7 torch contenders)
    assert "mlp-128 " not in out and "fastnn-fp32" not in out and "numpy-cpu" not in out
    assert "3 x 469 steps" in out and "1 x 1000 steps" in out


def test_skip_compile_and_unknown_names():
    contenders, _ = wl.select("torch", None, skip_compile=True, quick=True)
    names = [c.name for c in contenders]
    assert names == ["torch-eager-fp32", "torch-eager-amp", "torch-graph-fp32", "torch-graph-tf32", "torch-graph-amp"]
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
    b128, b1024 = full["mlp-1024-b128"], full["mlp-1024-b1024"]
    assert b128.sizes == b1024.sizes == full["mlp-1024"].sizes and b128.hidden == b1024.hidden == 1024
    assert (b128.batch_size, b128.steps_per_epoch, b128.steps) == (128, 250, 5000)
    assert (b1024.batch_size, b1024.steps_per_epoch, b1024.steps) == (1024, 32, 1280)
    assert b1024.batch_sizes()[-1] == 256 and sum(b1024.batch_sizes()) == wl.MLP_SAMPLES
    assert list(full) == ["logreg", *(f"mlp-{h}" for h in wl.HIDDEN_FULL), "mlp-1024-b128", "mlp-1024-b1024"]


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
    wl.write_json(tmp / PARTIAL_DIR / f"{run_id}.json", doc)


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
    saved = json.loads((tmp_path / RAW_DIR / "bench.json").read_text())
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
    # the compact JSON kept in git: no per-step series, and the same bench.md made from it
    kept = json.loads((tmp_path / "bench_summary.json").read_text())
    assert kept["rows"][0]["epoch_losses"] == [1.0, 0.5] and "description" not in kept["rows"][0]
    assert report.markdown(kept) == md
    # the rows come from two calls: a line per (contender, call); r2 ran no fastnn-mixed, so its speedups name
    # the call of the fastnn-mixed row they use
    assert "| torch-eager-fp32 (call 2) | 8 |" in md  # the time table, logreg column
    assert "| torch-eager-fp32 (call 2) | 8.00x (vs call 1) |" in md  # the speedup table
    assert "| torch-eager-amp (call 1) | 5.00x |" in md and "| fastnn-mixed (call 1) | 1 |" in md
    assert "40*" in md and "scaled from fewer epochs" in md
    assert "RuntimeError: boom" in md and "GPU of r2" in md
    assert [c for c in ("fastnn-mixed", "torch-eager-amp", "numpy-cpu") if f"`{c}`" not in md] == []


def test_the_committed_summary_makes_the_committed_tables():
    """results/ keeps bench.md and the compact bench_summary.json (the raw files stay out of git): they agree."""
    import report

    results = BENCH / "results"
    kept = json.loads((results / report.SUMMARY).read_text())
    assert report.markdown(kept) == (results / "bench.md").read_text()
    assert not any(key in row for row in kept["rows"] for key in report.RAW_ONLY)


def test_merge_refuses_quick_and_full_runs_together(tmp_path):
    import report

    with pytest.raises(SystemExit, match="no partial results"):
        report.write_outputs(tmp_path, plots=False)
    _partial(tmp_path, "r1", 1.0, [_row("logreg", "fastnn-mixed", 1.0, "r1")])
    full = {w.name: wl.plan_dict(w) for w in wl.build_workloads(quick=False)}
    doc = json.loads((tmp_path / PARTIAL_DIR / "r1.json").read_text())
    doc.update(run=dict(doc["run"], run_id="r2", started=2.0), workloads=full)
    wl.write_json(tmp_path / PARTIAL_DIR / "r2.json", doc)
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
    doc = json.loads((tmp_path / PARTIAL_DIR / "r1.json").read_text())
    doc["e2e_rows"] = [_e2e_row(w, c, m, t * (2 if m == "cold" else 1), 0.1)
                       for w in ("logreg", "mlp-128") for m in ("cold", "warm")
                       for c, t in (("fastnn-mixed", 1.0), ("torch-graph-amp", 4.0), ("jax-fp32", 6.0))]  # fmt: skip
    doc["e2e_rows"].append({**_e2e_row("logreg", "fastnn-fused", "cold", 0.0, 0.0), "status": "unavailable"})
    wl.write_json(tmp_path / PARTIAL_DIR / "r1.json", doc)
    report.write_outputs(tmp_path, plots=False)
    assert plots.main([str(tmp_path)]) == 0
    for name in ("time_graph.png", "loss_graph.png", "e2e_graph.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_every_table_and_graph_from_raw_results(tmp_path):
    """Issue 44: one merge makes every table (batch grid, many models, scaling, time to accuracy) and every graph
    from the raw results, and names each cell of the final run's plan that no result holds."""
    pytest.importorskip("matplotlib", reason="matplotlib (the 'bench' extra) draws the graphs")
    import publish
    import report

    plans = {w.name: wl.plan_dict(w) for w in wl.all_workloads(quick=False)}
    rows = []
    for h in (256, 1024):
        for b in (32, 64, 128):
            name = f"mlp-{h}" if b == 32 else f"mlp-{h}-b{b}"
            for c, t in (("fastnn-mixed", 1.0), ("jax-default", 1.5), ("torch-graph-amp", 2.0)):
                rows.append(_row(name, c, t * h / 256 * b / 32, hidden=h, steps=plans[name]["steps"],
                                 seconds_per_step=None))  # fmt: skip
    rows.append({**_row("mlp-256", "fastnn-grid-fp32", 0.0, hidden=256), "status": "unavailable",
                 "error": "EngineRefused: precision 'fp32' (it trains \"mixed\")"})  # fmt: skip
    doc = {"schema": 1, "run": {"run_id": "r1", "started": 1.0, "finished": 2.0, "args": {}, "argv": []},
           "environment": {"device": "GPU of r1", "date": "today"}, "workloads": plans, "rows": rows,
           "e2e_rows": [], "tta_rows": [
               {"workload": w, "contender": c, "mode": "cold", "run_id": "r1", "status": "ok", "target_accuracy": t,
                "reached": True, "epochs_to_target": 3, "e2e_seconds": 3.0 * f, "train_seconds": f,
                "best_accuracy": t + 0.01, "epochs": [{"epoch": e, "train_seconds": f / 3, "trained_at": e * f,
                                                       "evaluated_at": e * f + 0.1, "test_accuracy": t - 0.02 + e / 100}
                                                      for e in (1, 2, 3)]}
               for w, t in (("tta-logreg", 0.84), ("tta-mlp-128", 0.88))
               for c, f in (("fastnn-mixed", 1.0), ("torch-graph-amp", 4.0))]}  # fmt: skip
    wl.write_json(tmp_path / PARTIAL_DIR / "r1.json", doc)
    many = tmp_path / RAW_DIR / "many"
    many.mkdir(parents=True)
    for k in (1, 32):
        (many / f"logreg-k{k}.json").write_text(json.dumps([
            {"contender": c, "workload": "logreg", "models": k, "epoch_s": t * k ** 0.5, "device_s": None,
             "best_accuracy": 0.84, "best_model": 0, "accuracies": [0.84] * k, "steps": 469, "profile": None,
             "per_model_step_us": 1e6 * t * k ** 0.5 / k / 469}
            for c, t in (("fastnn", 0.01), ("jax-vmap", 0.03), ("fastnn-fold", 0.001))]))
    scaling = tmp_path / RAW_DIR / "scaling"
    scaling.mkdir()
    (scaling / "scaling.json").write_text(json.dumps({"device": "GPU x", "gpus": 2, "rows": [
        {"workload": "mlp4096", "sizes": [784, 4096, 4096, 4096, 10], "global_batch": 8192, "run": r,
         "samples_per_s": v, "vs_one_gpu": v / 2.8e6, "final_loss": 2.0}
        for r, v in (("1 GPU, no group", 2.8e6), ("2 GPUs, NCCL group", 4.4e6))]}))  # fmt: skip
    setup = tmp_path / RAW_DIR / "setup"
    setup.mkdir()
    (setup / "setup-fastnn.md").with_suffix(".json").write_text(json.dumps({"device": "GPU s", "rows": [
        {"contender": "fastnn-mixed", "family": "fastnn", "workload": "logreg", "mode": m, "status": "ok",
         "e2e_seconds": t - 0.1, "process_seconds": t, "train_seconds": 0.001}
        for m, t in (("cold", 2.5), ("warm", 0.8))
    ] + [{"contender": "fastnn-fused", "family": "fastnn", "workload": "mlp-1024", "mode": "cold",
          "status": "unavailable", "error": "EngineRefused: shared memory"},
         {"contender": "numpy-cpu", "family": "numpy", "workload": "mlp-8192", "mode": None, "status": "skipped",
          "error": "not run: the CPU engine runs logreg, mlp-128 only"}]}))  # fmt: skip
    report.write_outputs(tmp_path, plots=True)
    for name in ("time_graph", "batch_graph", "many_graph", "tta_graph"):
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    md = (tmp_path / "bench.md").read_text()
    assert "## The batch grid" in md and "| 256 | 64 | mlp-256-b64 | 800.0 | `jax-default` | 1200.0 | 1.50x |" in md
    assert "| 4096 | 512 | mlp-4096-b512 | not measured in this run |" in md
    assert "## Many models at once" in md
    # fastnn-fold is fastnn's own variant, not a peer: the speedup is over jax-vmap
    assert "| logreg | 1 | 21.322 | 2.132 | 63.966 | not measured in this run | 3.00x |" in md
    assert "| logreg | 1024 | not measured in this run |" in md
    assert "## Data-parallel scaling (2x GPU x)" in md and "| mlp4096 | 8192 | 2 GPUs, NCCL group | 4,400,000 |" in md
    assert "| tta-logreg | 0.84 | fastnn-mixed | 3 | 3.00 | 1.00 | 0.8500 | 1.00 | 1.00 |" in md
    # the closing list: what the plan has and the results lack, and the refused engine with its reason
    assert "- train, `fastnn-grid-fp32` on mlp-256: n/a (EngineRefused: precision 'fp32'" in md
    assert "- train, `torch-compile-amp`: not measured in this run: logreg, mlp-128, mlp-1024, mlp-8192" in md
    assert "- many, `torch-func-graphs`: not measured in this run: logreg K=1, logreg K=32, logreg K=128, logreg" in md
    assert "- scaling, `2 GPUs, devices=2`: not measured in this run: mlp4096, logreg, mlp128" in md
    assert "- tta, `jax-best`: not measured in this run: tta-logreg, tta-mlp-128, tta-mlp-256" in md
    assert "- e2e, `fastnn-mixed`: not measured in this run: logreg cold, logreg warm" in md
    assert "## From a fresh process to one trained epoch (bench_setup.py, GPU s)" in md
    assert "| logreg | fastnn-mixed | 2.50 | 0.80 | not measured in this run | 0.001 |" in md
    assert "| mlp-1024 | fastnn-fused | unavailable | not measured in this run | not measured in this run | – |" in md
    assert "- setup, `fastnn-fused` on mlp-1024 cold: unavailable (EngineRefused: shared memory)" in md
    assert "- setup, `numpy-cpu`: not measured in this run: logreg cold, logreg warm, logreg warm again, mlp-128" in md
    assert "mlp-8192" not in next(x for x in md.splitlines() if x.startswith("- setup, `numpy-cpu`"))
    # the time table: a planned cell without a row says so, an unplanned one stays empty
    line = next(x for x in md.splitlines() if x.startswith("| fastnn-grid-fp32 |"))
    cells = [c.strip() for c in line.split("|")[2:-1]]  # mlp-256, mlp-1024, mlp-1024-b128, then 3 of the grid
    assert cells == ["n/a", "not measured in this run", "not measured in this run", "", "", ""]
    summary = json.loads((tmp_path / report.SUMMARY).read_text())
    assert summary["many_rows"] and "accuracies" not in summary["many_rows"][0]
    assert report.markdown(summary) == md
    made = publish.blocks(summary)
    assert made["many"].startswith("| workload | K |") and "GPU x" in made["scaling"]
    assert "not measured in this run" in made["missing"] and "| 256 | 128 |" in made["batch"]
    assert made["startup"].startswith("GPU s, seconds:")


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
    from fastnn._model import init_parameters, param_names

    model = torch_contenders.build_model((784, 32, 32, 10), torch.device("cpu"))
    sd = model.state_dict()
    assert list(sd) == param_names(MLP([784, 32, 32, 10]))
    for k, v in init_parameters(MLP([784, 32, 32, 10]), wl.SEED).items():
        np.testing.assert_array_equal(sd[k].numpy(), v)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        contender = next(c for c in wl.CONTENDERS if c.name == "torch-graph-amp")
        torch_contenders.run_torch(contender, wl.build_workloads(True)[0], None, device="cpu")


# ---- JAX, fastnn's engines, end to end, time to accuracy, drift ----------------------------------------------


def _tiny_data(n: int = 100) -> tuple:
    rng = np.random.default_rng(1)
    return (
        rng.integers(0, 256, size=(n, 784), dtype=np.uint8),
        rng.integers(0, 10, size=n).astype(np.int64),
        rng.integers(0, 256, size=(40, 784), dtype=np.uint8),
        rng.integers(0, 10, size=40).astype(np.int64),
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_jax_scan_matches_the_numpy_engine(optimizer, monkeypatch):
    """The JAX epoch (scan + short last batch) from fastnn's weights in fastnn's order: the NumPy engine's losses."""
    pytest.importorskip("jax", reason="jax is not installed (pip install jax to run this)")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    import fastnn_contenders
    import jax_contenders

    data = _tiny_data()
    lr = 0.05 if optimizer == "sgd" else 0.01
    w = wl.Workload("t", (784, 24, 16, 10), lr=lr, batch_size=32, samples=100, epochs=2, optimizer=optimizer,
                    weight_decay=0.01 if optimizer == "adamw" else 0.0)  # fmt: skip
    contenders = {c.name: c for c in wl.CONTENDERS}
    # a fresh NumPy trainer on the timed epochs (1, 2): AdamW's moments and step count start from zero, as JAX's do
    with fastnn_contenders.make_trainer(contenders["numpy-cpu"], w) as trainer:
        trainer.epoch = wl.FIRST_TIMED_EPOCH
        hist = trainer.fit(data[0], data[1], epochs=w.epochs)
        ref = {"epoch_losses": list(hist["train_loss"]), "test_loss": trainer.evaluate(data[2], data[3])["loss"]}
    got = jax_contenders.run_jax(contenders["jax-fp32"], w, data)
    np.testing.assert_allclose(got["epoch_losses"], ref["epoch_losses"], rtol=2e-5)
    assert got["test_loss"] == pytest.approx(ref["test_loss"], rel=2e-5)
    assert got["epoch_losses"][1] < got["epoch_losses"][0]
    amp = jax_contenders.run_jax(contenders["jax-amp"], w, data)  # fp16 operands: close, not equal
    np.testing.assert_allclose(amp["epoch_losses"], ref["epoch_losses"], rtol=5e-3)
    # another order gives other losses: the comparison above can fail
    job = jax_contenders.Job(w, data, amp=False)
    _, losses = job.epoch_fn(job.init, job.x, job.y, job.order(0))
    sizes = np.array(w.batch_sizes(), dtype=np.float64)
    assert float((np.asarray(losses) * sizes).sum() / w.samples) != pytest.approx(got["epoch_losses"][0], rel=1e-6)


def test_jax_dry_run_runs_each_configuration_in_its_subprocess():
    pytest.importorskip("jax", reason="jax is not installed")
    res = run_bench("--dry-run", "--quick", "--only", "jax", "--only-workload", "logreg,mlp-128,mlp-1024")
    assert res.returncode == 0, res.stdout + res.stderr
    for c in ("jax-default", "jax-fp32", "jax-amp", "jax-fp32-cmdbuf", "jax-fp32-nocmdbuf"):
        assert f"logreg    {c}" in res.stdout and f"mlp-128   {c}" in res.stdout
    assert res.stdout.count("jax ok on cpu") == 15
    assert "mlp-1024  jax-fp32 " in res.stdout and "mlp-1024  jax-fp32-cmdbuf" in res.stdout


def test_jax_subprocess_env_carries_the_flags():
    import jax_contenders

    c = next(c for c in wl.CONTENDERS if c.name == "jax-fp32-cmdbuf")
    env = jax_contenders.subprocess_env(c, {"PATH": "/bin"})
    assert "WHILE" in env["XLA_FLAGS"] and "--xla_gpu_graph_min_graph_size=1" in env["XLA_FLAGS"]
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and str(REPO) in env["PYTHONPATH"]


def test_engine_rows_are_unavailable_not_faked(monkeypatch):
    import fastnn_contenders

    import fastnn

    fused = next(c for c in wl.CONTENDERS if c.name == "fastnn-fused")
    mixed = next(c for c in wl.CONTENDERS if c.name == "fastnn-mixed")
    assert fastnn_contenders.engine_kwargs(mixed, "cpu") == {}

    class OldTrainer:  # a Trainer from before the engine parameter
        def __init__(self, model, optimizer=None, batch_size=128, device="auto"): ...

    monkeypatch.setattr(fastnn, "Trainer", OldTrainer)
    with pytest.raises(fastnn_contenders.Unavailable, match="no engine parameter"):
        fastnn_contenders.engine_kwargs(fused, "cuda")

    class NewTrainer:
        def __init__(self, model, engine="auto"): ...

    monkeypatch.setattr(fastnn, "Trainer", NewTrainer)
    assert fastnn_contenders.engine_kwargs(fused, "cuda") == {"engine": "fused"}
    with pytest.raises(fastnn_contenders.Unavailable, match="GPU only"):
        fastnn_contenders.engine_kwargs(fused, "cpu")


def test_tta_summary_bookkeeping():
    import end_to_end

    epochs = [
        {"epoch": 1, "train_seconds": 0.5, "trained_at": 3.0, "evaluated_at": 3.1, "test_accuracy": 0.85},
        {"epoch": 2, "train_seconds": 0.25, "trained_at": 3.4, "evaluated_at": 3.5, "test_accuracy": 0.891},
    ]
    s = end_to_end.tta_summary(epochs, 0.89)
    assert s["reached"] and s["epochs_to_target"] == 2
    assert s["e2e_seconds"] == 3.5 and s["train_seconds"] == pytest.approx(0.75) and s["best_accuracy"] == 0.891
    s = end_to_end.tta_summary(epochs[:1], 0.89)
    assert not s["reached"] and s["e2e_seconds"] is None and s["train_seconds"] is None
    w = wl.tta_workload()
    assert w.sizes == (784, 256, 256, 10) and w.optimizer == "adamw" and w.target_accuracy == 0.89
    assert w.fastnn_optimizer().lr == w.lr and w.steps_per_epoch == 469


def test_best_jax_configuration():
    import end_to_end

    rows = [_row("logreg", "fastnn-mixed", 0.1)]
    assert end_to_end.best_jax(rows)[0] == "jax-fp32"  # no JAX rows: the default
    for c, t in (("jax-fp32", 1.0), ("jax-amp", 1.2), ("jax-fp32-cmdbuf", 0.9)):
        rows += [_row("logreg", c, t), _row("mlp-128", c, t)]
    rows.append(_row("mlp-1024", "jax-amp", 0.01))  # a workload the others lack does not count
    name, why = end_to_end.best_jax(rows)
    assert name == "jax-fp32-cmdbuf" and "logreg, mlp-128" in why


def test_end_to_end_and_tta_subprocesses(tmp_path):
    """The fresh-process harness on the CPU (NumPy engine, tiny fake data): cold then warm, marks in order."""
    res = run_bench("--no-train", "--e2e", "--e2e-only", "numpy-cpu", "--e2e-workload", "logreg,mlp-128", "--tta",
                    "--tta-only", "numpy-cpu", "--tta-workload", "tta-logreg,tta-mlp-256", "--tiny", "--out",
                    str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--no-plots")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((tmp_path / RAW_DIR / "bench.json").read_text())
    e2e = {(r["workload"], r["mode"]): r for r in doc["e2e_rows"]}
    assert set(e2e) == {("logreg", "cold"), ("logreg", "warm"), ("mlp-128", "cold"), ("mlp-128", "warm")}
    for r in e2e.values():
        assert r["status"] == "ok", r
        m = r["marks"]
        assert 0 < m["process_start"] < m["imported"] <= m["data_loaded"] <= m["set_up"] <= m["trained"]
        assert r["e2e_seconds"] == m["trained"] and 0 < r["train_seconds"] < r["e2e_seconds"]
        assert len(r["epoch_seconds"]) == 2 and r["speedup_e2e"] is None  # no fastnn-mixed row to compare with
    seed_tta, tta = doc["tta_rows"]
    assert seed_tta["workload"] == "tta-logreg" and seed_tta["target_accuracy"] == 0.84
    assert seed_tta["status"] == "ok" and seed_tta["epochs"] and not seed_tta["reached"]
    assert tta["status"] == "ok" and tta["target_accuracy"] == 0.89 and len(tta["epochs"]) == 2
    assert not tta["reached"] and tta["e2e_seconds"] is None  # fake labels: never 89%
    assert [e["epoch"] for e in tta["epochs"]] == [1, 2]
    md = (tmp_path / "bench.md").read_text()
    assert "## End to end" in md and "| numpy-cpu |" in md and "not reached" in md


def _e2e_row(workload, contender, mode, seconds, train, run_id="r1", **extra):
    return {"table": "e2e", "workload": workload, "contender": contender, "mode": mode, "run_id": run_id,
            "status": "ok", "e2e_seconds": seconds, "train_seconds": train, "chosen": "", **extra}  # fmt: skip


def test_merge_drift_repeats_engines_e2e_and_tta(tmp_path):
    import report

    _partial(tmp_path, "r1", 1.0, [
        _row("logreg", "fastnn-mixed", 1.0, "r1"),
        _row("logreg", "torch-eager-amp", 5.0, "r1"),
        _row("logreg", "jax-fp32", 2.0, "r1", xla_flags=""),
        {**_row("logreg", "fastnn-fused", 0.0, "r1"), "status": "unavailable", "error": "no engine parameter"},
    ])  # fmt: skip
    _partial(tmp_path, "r2", 2.0, [
        _row("logreg", "fastnn-mixed", 1.25, "r2", repeat=True),  # the drift repeat: beside r1's row
        _row("logreg", "torch-compile-amp", 5.0, "r2"),
    ])  # fmt: skip
    doc = json.loads((tmp_path / PARTIAL_DIR / "r2.json").read_text())
    doc["e2e_rows"] = [_e2e_row("logreg", "fastnn-mixed", "cold", 2.0, 0.2, "r2"),
                       _e2e_row("logreg", "jax-fp32", "cold", 8.0, 0.4, "r2"),
                       _e2e_row("logreg", "fastnn-mixed", "warm", 1.0, 0.2, "r2"),
                       _e2e_row("logreg", "jax-fp32", "warm", 3.0, 0.4, "r2")]  # fmt: skip
    doc["tta_rows"] = [
        {"workload": "tta-mlp-256", "contender": c, "mode": "cold", "run_id": "r2", "status": "ok",
         "target_accuracy": 0.89, "reached": True, "epochs_to_target": 11, "e2e_seconds": e, "train_seconds": t,
         "best_accuracy": 0.892} for c, e, t in (("fastnn-mixed", 3.0, 1.0), ("torch-graph-amp", 9.0, 3.0))
    ]  # fmt: skip
    wl.write_json(tmp_path / PARTIAL_DIR / "r2.json", doc)
    doc = report.write_outputs(tmp_path, plots=False)
    rows = {(r["workload"], r["contender"]): r for r in doc["rows"]}
    mixed = rows[("logreg", "fastnn-mixed")]
    assert mixed["train_seconds"] == 1.0 and mixed["repeats"][0]["drift"] == pytest.approx(0.25)
    # same-run reference: compile (r2) against r2's repeat, eager (r1) against r1's row
    assert rows[("logreg", "torch-compile-amp")]["speedup_fastnn_mixed"] == pytest.approx(4.0)
    assert rows[("logreg", "torch-eager-amp")]["speedup_fastnn_mixed"] == pytest.approx(5.0)
    e2e = {(r["contender"], r["mode"]): r for r in doc["e2e_rows"]}
    assert e2e[("jax-fp32", "cold")]["speedup_e2e"] == pytest.approx(4.0)
    assert e2e[("jax-fp32", "warm")]["speedup_e2e"] == pytest.approx(3.0)
    assert e2e[("jax-fp32", "warm")]["speedup_train"] == pytest.approx(2.0)
    tta = {r["contender"]: r for r in doc["tta_rows"]}
    assert tta["torch-graph-amp"]["speedup_e2e"] == pytest.approx(3.0)
    assert tta["torch-graph-amp"]["speedup_train"] == pytest.approx(3.0)
    md = (tmp_path / "bench.md").read_text()
    assert "| fastnn-fused (call 1) | n/a |" in md  # unavailable, not a time and not "failed"
    assert "## Drift between device calls" in md and "+25.0%" in md
    assert "## Best JAX configuration" in md and "`jax-fp32`" in md
    assert "| jax-fp32 | 8.00 | 3.00 |" in md and "| jax-fp32 | 4.00x | 3.00x |" in md
    assert "## Time to a test accuracy" in md and "tta-mlp-128: 784-128-128-128-10, ADAMW lr 0.001" in md
    assert "| tta-mlp-256 | 0.89 | torch-graph-amp | 11 | 9.00 | 3.00 | 0.8920 | 3.00 | 3.00 |" in md


def test_final_preset_covers_every_published_contender():
    import bench_mnist
    import final

    seen, workloads_seen = set(), set()
    first = {w.name for w in wl.build_workloads(quick=False)}
    for call in bench_mnist.FINAL:
        ns = bench_mnist.parse_args(["--final", call])
        if ns.no_train:
            continue
        contenders, workloads = wl.select(ns.only, ns.only_workload, ns.skip_compile, ns.quick)
        seen |= {c.name for c in contenders}
        workloads_seen |= {w.name for w in workloads}
        assert "fastnn-mixed" in ns.only.split(",")
        # a call that repeats call 1's workloads repeats fastnn-mixed as a drift row; the batch grid's are new
        assert ns.drift == "fastnn-mixed" or ns.final == "1" or not first & {w.name for w in workloads}
    assert seen == {c.name for c in wl.CONTENDERS}
    assert workloads_seen == {w.name for w in wl.all_workloads(quick=False)}  # the batch grid included
    # call 1 alone is the headline: fastnn auto, its engines and every peer that can be fastest, every workload
    ns = bench_mnist.parse_args(["--final", "1", "--out", "x"])
    contenders, workloads = wl.select(ns.only, ns.only_workload, ns.skip_compile, ns.quick)
    fastnn_rows = {"fastnn-mixed", "fastnn-graph", "fastnn-fused", "fastnn-grid"}
    assert {c.name for c in contenders} == fastnn_rows | set(bench_mnist.PEERS)
    assert {"jax-default", "torch-graph-tf32"} <= set(bench_mnist.PEERS) and ns.drift == "" and ns.out == "x"
    assert [w.name for w in workloads] == [w.name for w in wl.build_workloads(quick=False)]
    ns = bench_mnist.parse_args(["--final", "5"])
    assert ns.no_train and ns.e2e and not ns.tta
    ns = bench_mnist.parse_args(["--final", "6"])
    assert ns.no_train and ns.tta and ns.tta_workload.split(",") == ["tta-logreg", "tta-mlp-128", "tta-mlp-256"]
    # every call of the final run: bench_mnist's presets, bench_many per K, bench_scaling on two GPUs
    assert [n for n in final.CALLS if final.CALLS[n].commands[0][0].endswith("bench_mnist.py")] == list(final.FINAL)
    assert {(w, k) for w, k, _ in final.many_plan()} == {("logreg", k) for k in (1, 32, 128, 1024)} | {
        ("mlp-128", k) for k in (1, 32, 128)}
    assert [c.gpus for c in final.CALLS.values()].count(2) == 1


def test_a_final_call_ends_inside_its_limit_and_keeps_its_record(tmp_path, monkeypatch):
    """final.py kills a call's command at the call's limit (the device's 10 minutes), records it as 124, keeps what
    it printed and copies raw/ to $OUT (the folder that comes back from the device)."""
    import final

    # a grandchild holding the output pipe, as bench_mnist.py's JAX subprocesses do: the whole group must go
    slow = ("-c", "import subprocess, sys, time; print('started', sys.argv[1:], flush=True); "
            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])")  # fmt: skip
    monkeypatch.setattr(final, "CALLS", {"x": final.Call("a slow call", (slow, slow))})
    monkeypatch.setattr(final, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(final, "MIN_LEFT_S", 2.0)
    start = time.monotonic()
    rc = final.run_call("x", "DATA", limit_s=4.0, copy_to=str(tmp_path / "out"))
    assert rc == 124 and time.monotonic() - start < 30
    (record,) = json.loads((tmp_path / "results" / "raw" / "calls.json").read_text())
    assert record["rc"] == 124 and record["commands"][0]["rc"] == 124 and record["commands"][0]["argv"][-1] == "DATA"
    assert record["commands"][1]["rc"] is None and record["commands"][1]["why"] == "no time left in this call"
    assert "started ['--data', 'DATA']" in (tmp_path / "out" / "raw" / "callx.log").read_text()


def test_scaling_json_is_what_the_report_reads(tmp_path):
    """bench_scaling.py --json writes the rows report.py's scaling table reads, with the device and GPU count it
    is given (a CPU-only install has no driver to ask)."""
    import bench_scaling
    import report

    rows = {"1 GPU, no group": [(1.0, 1000, 0.5)], "2 GPUs, NCCL group": [(0.8, 1000, 0.5)]}
    bench_scaling.write_rows(str(tmp_path / "raw" / "scaling" / "s.json"), ["logreg"], rows, "Fake H100", 2)
    doc = report.load_extra(tmp_path)
    assert [r["run"] for r in doc["scaling_rows"]] == list(rows) and doc["scaling_rows"][1]["gpus"] == 2
    table = report.scaling_table(doc)
    assert table[-1] == "| logreg | 128 | 2 GPUs, NCCL group | 1,250 | 1.25x | 0.5000 |"


def test_batch_grid_is_one_selection():
    """Issue 44's batch grid: batch 64, 128, 256, 512 at h = 256, 1024, 4096, selectable in one word; the committed
    run's mlp-1024-b128 is the same workload (same epochs), so both runs' rows merge."""
    _, grid = wl.select(None, "batch", False, quick=False)
    pairs = [(h, b) for h in (256, 1024, 4096) for b in (64, 128, 256, 512)]
    assert sorted((w.hidden, w.batch_size) for w in grid) == pairs
    same = {w.name: w for w in wl.build_workloads(quick=False)}["mlp-1024-b128"]
    assert next(w for w in grid if w.name == "mlp-1024-b128") == same
    assert all(w.steps >= 1250 and w.samples == 32_000 for w in grid)
    _, default = wl.select(None, None, False, quick=False)
    assert "mlp-256-b64" not in {w.name for w in default}  # the default run stays the ten workloads
    _, everything = wl.select(None, "all", False, quick=False)
    assert {w.name for w in everything} == {w.name for w in default} | {w.name for w in grid}
    with pytest.raises(SystemExit, match="batch"):
        wl.select(None, "mlp-7", False, quick=False)


def test_engine_precision_contenders():
    """Each fastnn engine in fp16 and fp32 is a contender; the settings come from the definition."""
    names = {c.name: c for c in wl.CONTENDERS}
    for e in ("graph", "fused", "grid"):
        for p in ("fp16", "fp32"):
            c = names[f"fastnn-{e}-{p}"]
            assert (c.engine, c.precision) == (e, p)
            assert wl.settings(c) == f'fastnn.Trainer(precision="{p}", engine="{e}")'
    compile_max = names["torch-compile-amp"]
    assert wl.compile_kwargs(compile_max) == {"mode": "max-autotune", "fullgraph": True, "dynamic": False}


def test_seed_time_to_accuracy_workloads():
    """The seeds' style: logreg to 0.84, MLP-128 to 0.88 (all 60,000 images), beside MLP-256 to 0.89."""
    ws = {w.name: w for w in wl.tta_workloads()}
    assert list(ws) == ["tta-logreg", "tta-mlp-128", "tta-mlp-256"]
    assert ws["tta-logreg"].target_accuracy == 0.84 and ws["tta-logreg"].sizes == (784, 10)
    assert ws["tta-mlp-128"].target_accuracy == 0.88 and ws["tta-mlp-128"].sizes == (784, 128, 128, 128, 10)
    assert all(w.samples == 60_000 for w in ws.values())


# ---- issue 27: every peer as its users run it, the fastest peer of one call, published numbers from the results ---


def test_new_contenders_settings_come_from_their_definitions():
    """The settings the tables print are made from the fields the runners read: change a field, the text follows."""
    c = {c.name: c for c in wl.CONTENDERS}
    assert c["torch-graph-tf32"].matmul_precision == "high" and c["torch-graph-fp32"].matmul_precision == "highest"
    assert wl.settings(c["torch-graph-tf32"]).endswith('torch.set_float32_matmul_precision("high") (TF32)')
    assert wl.compile_kwargs(c["torch-compile-default-amp"]) == {"mode": "default", "fullgraph": True, "dynamic": False}
    assert wl.compile_kwargs(c["torch-compile-amp"])["mode"] == "max-autotune"
    assert wl.settings(c["torch-compile-default-amp"]).startswith(
        "torch.compile(mode='default', fullgraph=True, dynamic=False); torch.autocast"
    )
    assert c["jax-default"].matmul_precision == "default" and c["jax-fp32"].matmul_precision == "highest"
    assert "fp32, dot without precision= (JAX's default" in wl.settings(c["jax-default"])
    assert "dot precision=lax.Precision.HIGHEST (no TF32)" in wl.settings(c["jax-fp32"])
    assert wl.settings(c["fastnn-mixed"]) == 'fastnn.Trainer(precision="mixed", engine="auto")'
    assert "(no TF32)" in wl.settings(dataclasses.replace(c["torch-graph-tf32"], matmul_precision="highest"))
    with pytest.raises(ValueError, match="matmul_precision"):
        wl.settings(dataclasses.replace(c["jax-default"], matmul_precision="tf32"))
    with pytest.raises(ValueError, match="not a torch.compile contender"):
        wl.compile_kwargs(c["torch-graph-amp"])
    kept, _ = wl.select("torch", None, skip_compile=True, quick=False)
    assert [x.name for x in kept] == [x.name for x in wl.CONTENDERS if x.family == "torch" and x.kind != "compile"]


def test_jax_default_precision_leaves_the_dots_to_jax(monkeypatch):
    """jax-default lowers its fp32 dots with JAX's DEFAULT precision (TF32 on Hopper), jax-fp32 with HIGHEST."""
    pytest.importorskip("jax", reason="jax is not installed")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    import jax_contenders

    c = {c.name: c for c in wl.CONTENDERS}
    w = wl.Workload("t", (784, 16, 10), lr=0.05, batch_size=8, samples=20, epochs=1)
    data = _tiny_data(20)
    text = {}
    for name in ("jax-default", "jax-fp32"):
        job = jax_contenders.Job(w, data, amp=False, matmul_precision=c[name].matmul_precision)
        text[name] = job.epoch_fn.lower(job.init, job.x, job.y, job.order(0)).as_text()
    assert "precision = [HIGHEST, HIGHEST]" in text["jax-fp32"] and "DEFAULT" not in text["jax-fp32"]
    assert "precision = [DEFAULT, DEFAULT]" in text["jax-default"] and "HIGHEST" not in text["jax-default"]
    # on the CPU the default is fp32 too: the same losses (on Hopper the difference is TF32's rounding)
    rows = [jax_contenders.run_jax(c[name], w, data) for name in ("jax-default", "jax-fp32")]
    np.testing.assert_allclose(rows[0]["epoch_losses"], rows[1]["epoch_losses"], rtol=1e-5)


def test_torch_runners_take_the_contenders_settings(monkeypatch):
    """torch.compile gets the contender's compile_kwargs; the matmul precision is the contender's."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch_contenders

    seen = {}

    def fake_compile(module, **kwargs):
        seen.update(kwargs)
        return module

    monkeypatch.setattr(torch_contenders.torch, "compile", fake_compile)
    c = {c.name: c for c in wl.CONTENDERS}
    w = wl.Workload("t", (784, 16, 10), lr=0.05, batch_size=8, samples=20, epochs=1)
    job = torch_contenders._Job(w, _tiny_data(20), torch.device("cpu"), amp=False)
    torch_contenders.make_runner(job, c["torch-compile-default-amp"])
    assert seen == {"mode": "default", "fullgraph": True, "dynamic": False}
    before = torch.get_float32_matmul_precision()
    try:
        torch_contenders.set_matmul_precision(c["torch-graph-tf32"])
        assert torch.get_float32_matmul_precision() == "high"
        torch_contenders.set_matmul_precision(c["torch-graph-fp32"])
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


def test_best_peer_is_chosen_within_one_call():
    import report

    rows = [
        _row("logreg", "fastnn-mixed", 1.0, "r1"),
        _row("logreg", "torch-graph-amp", 1.3, "r1"),  # 1.3x fastnn's time of its call
        _row("logreg", "jax-default", 1.2, "r2"),  # less time, but 1.5x fastnn's 0.8 of its own call
        _row("logreg", "fastnn-fused", 0.5, "r1"),  # fastnn's own engines and NumPy are not peers
        _row("logreg", "numpy-cpu", 0.1, "r1"),
        _row("mlp-128", "fastnn-mixed", 2.0, "r1"),
        _row("mlp-128", "jax-amp", 1.0, "r3"),  # no fastnn-mixed in its call: not compared
    ]
    rows[0]["repeats"] = [_row("logreg", "fastnn-mixed", 0.8, "r2", repeat=True)]
    pair = report.best_peer(rows, "logreg")
    assert (pair[0]["contender"], pair[1]["run_id"]) == ("torch-graph-amp", "r1")
    assert report.ratio(pair) == pytest.approx(1.3)
    pair = report.best_peer(rows, "logreg", ("jax",))
    assert pair[1]["train_seconds"] == 0.8 and report.ratio(pair) == pytest.approx(1.5)
    assert report.best_peer(rows, "mlp-128") is None and report.same_call_pairs(rows, "mlp-128") == []
    # within one call the fastest peer wins
    rows.append(_row("logreg", "torch-graph-tf32", 1.1, "r1"))
    assert report.best_peer(rows, "logreg")[0]["contender"] == "torch-graph-tf32"


def _table_cells(lines: list[str]) -> list[list[str]]:
    body = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| workload")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in body]


def test_published_ratios_recompute_from_the_rows_the_tables_show():
    """Every speedup in the fastest-peer and per-family tables is the ratio of two times printed beside it."""
    import report

    doc = json.loads((BENCH / "results" / report.SUMMARY).read_text())
    peers = _table_cells(report.peers_table(doc))
    assert len(peers) == len(report.compared_workloads(doc)) >= 7  # committed run: logreg, h = 128..1024, 4096, 8192
    for cells in peers:
        fast, peer, speedup = float(cells[2].split()[0]), float(cells[4]), float(cells[5].rstrip("x"))
        assert peer / fast == pytest.approx(speedup, abs=0.005 + 0.0011 * speedup), cells
    import publish

    summary = _table_cells(publish.summary_block(doc).splitlines())
    assert len(summary) == len(peers)  # the README's small table: the same pairs
    for cells, full in zip(summary, peers):
        assert cells[0].startswith(full[0] + ": ") and cells[3] == full[5], (cells, full)
        assert float(cells[2].split()[0]) / float(cells[1]) == pytest.approx(float(cells[3][:-1]), rel=0.003)
    families = _table_cells(report.families_table(doc))
    assert len(families) == len(peers)
    for cells in families:
        for name, peer, fast, speedup in (cells[1:5], cells[5:9]):
            if not name:  # no contender of that family ran this workload in the committed run
                continue
            ratio = float(speedup[:-1])
            assert float(peer) / float(fast) == pytest.approx(ratio, abs=0.005 + 0.0011 * ratio), cells
            assert name.startswith("`torch-") or name.startswith("`jax-")


def _publish_doc(tmp_path: Path) -> Path:
    """A results folder whose run has fastnn ahead on logreg, level on mlp-128 and behind on mlp-1024-b1024."""
    import report

    plans = {w.name: wl.plan_dict(w) for w in wl.build_workloads(quick=False)}
    rows = [
        _row("logreg", "fastnn-mixed", 1.0, engine="fused"),
        _row("logreg", "jax-default", 2.0),
        _row("logreg", "torch-graph-tf32", 3.0),
        _row("mlp-128", "fastnn-mixed", 1.0, engine="fused"),
        _row("mlp-128", "jax-amp", 1.01),
        _row("mlp-1024-b1024", "fastnn-mixed", 1.0, engine="graph", hidden=1024),
        _row("mlp-1024-b1024", "torch-graph-tf32", 0.8, hidden=1024),
        _row("mlp-1024-b1024", "jax-default", 0.9, hidden=1024),
    ]
    doc = {"schema": 1, "run": {"run_id": "r1", "started": 1.0, "finished": 2.0, "args": {}, "argv": []},
           "environment": {"device": "GPU of r1", "date": "today"}, "workloads": plans, "rows": rows}  # fmt: skip
    results = tmp_path / "results"
    wl.write_json(results / PARTIAL_DIR / "r1.json", doc)
    report.write_outputs(results, plots=False)
    return results


def test_publish_rewrites_only_the_marked_blocks(tmp_path):
    import publish

    results = _publish_doc(tmp_path)
    page = tmp_path / "README.md"
    page.write_text("intro\n<!-- bench:headline -->\nold 1.85x\n<!-- /bench -->\nmiddle\n"
                    "<!-- bench:peers -->\n<!-- /bench -->\nend\n")  # fmt: skip
    assert publish.publish(results, tmp_path, check=True) == [page] and "old 1.85x" in page.read_text()
    assert publish.publish(results, tmp_path) == [page]
    assert publish.publish(results, tmp_path, check=True) == []  # the pages now match the results
    text = page.read_text()
    assert text.startswith("intro\n<!-- bench:headline -->\n\nOn one GPU of r1, fastnn") and "old 1.85x" not in text
    assert "\n<!-- /bench -->\nmiddle\n<!-- bench:peers -->\n\nTraining time per step" in text
    assert text.endswith("<!-- /bench -->\nend\n")
    headline = " ".join(publish.headline(json.loads((results / "bench_summary.json").read_text())).split())
    assert "setup measured on 1 of 3 workloads: logreg (2.00x over `jax-default`)" in headline
    assert "it is level with the fastest peer (within 2%) on mlp-128 (1.01x, `jax-amp`)" in headline
    assert "it is slower on mlp-1024-b1024 (0.80x: `torch-graph-tf32` is 25% faster)" in headline
    assert "0.80-3.00x over PyTorch's fastest (`torch-graph-tf32`)" in headline
    # the table: fastnn and the fastest peer from the same call, and the peer's settings from its definition
    row = "| 784-1024-1024-1024-10, batch 1024 | 10000.0 (graph) | `torch-graph-tf32` | 8000.0 | 0.80x |"
    assert "| mlp-1024-b1024 " + row in text
    assert '- `torch-graph-tf32`: `one torch.cuda.CUDAGraph per epoch of whole steps; fp32; torch.set_float32' in text
    doc = json.loads((results / "bench_summary.json").read_text())
    assert "mlp-1024-b1024 is among the larger batches" in " ".join(publish.behind_block(doc).split())
    with pytest.raises(SystemExit, match="unknown block"):
        publish.rewrite("<!-- bench:nope -->\n<!-- /bench -->\n", publish.blocks(doc))
    with pytest.raises(SystemExit, match="has no `<!-- /bench -->`"):
        publish.rewrite("<!-- bench:headline -->\ntext\n", publish.blocks(doc))


def test_published_pages_match_the_committed_results():
    """README.md and the docs print no benchmark number by hand: their marked blocks are what `report.py --publish`
    makes from benchmarks/results/bench_summary.json (after a new run: run it and commit the pages)."""
    import publish

    expected = {"README.md": {"summary"}, "docs/index.md": {"headline"},
                "docs/benchmarks/index.md": set(publish.BLOCKS) - {"headline", "summary"}}  # fmt: skip
    assert set(expected) == set(publish.TARGETS)
    for rel, names in expected.items():
        assert set(re.findall(r"<!-- bench:([a-z0-9-]+) -->", (REPO / rel).read_text())) == names, rel
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(BENCH / "report.py"), "--check"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0 and "match" in res.stdout, res.stdout + res.stderr


# ---- kernel experiments (benchmarks/kernels/): one file each, kept compiling beside the product -----------------


@pytest.mark.parametrize("path", sorted((BENCH / "kernels").glob("*.py")), ids=lambda p: p.stem)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.bindings
def test_each_kernel_experiment_compiles_and_states_its_result(path, arch, monkeypatch, tmp_path):
    """Every experiment that left the product still compiles (NVRTC, no GPU) against today's native/ headers, and
    its docstring records the measurement that decided it."""
    import importlib.util

    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location(f"kernel_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "Result" in module.__doc__ and "us" in module.__doc__, path
    assert module.compile_kernel(arch)[:4] == b"\x7fELF"


def test_setup_benchmark_dry_run(tmp_path):
    """bench_setup.py (issue 26) on the CPU: three fresh processes per pair with the same cache folders, emptied
    before the cold run; the phase tables in markdown; GPU contenders and wide CPU workloads listed as not run."""
    stale = tmp_path / "cache" / "numpy-cpu" / "logreg" / "fastnn" / "stale"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "setup.md"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_setup.py"), "--dry-run", "--only", "numpy-cpu,fastnn-fused",
         "--workloads", "logreg,mlp-1024", "--out", str(out), "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert not stale.exists()  # the cold run started from empty cache folders
    doc = json.loads(out.with_suffix(".json").read_text())
    runs = [r for r in doc["rows"] if r["status"] == "ok"]
    assert [(r["workload"], r["contender"], r["mode"]) for r in runs] == [
        ("logreg", "numpy-cpu", m) for m in ("cold", "warm", "warm again")
    ]
    for r in runs:
        m = r["marks"]
        assert 0 < m["process_start"] < m["imported"] <= m["harness_ready"] <= m["data_loaded"] <= m["trained"]
        assert m["trained"] < r["process_seconds"] and len(r["epoch_seconds"]) == 1  # one epoch, whole process
        assert r["test_accuracy"] is None  # the process exits once trained: no evaluation in its time
    skipped = {(r["workload"], r["contender"]): r["error"] for r in doc["rows"] if r["status"] == "skipped"}
    assert skipped == {
        ("mlp-1024", "numpy-cpu"): "not run: the CPU engine runs logreg, mlp-128 only",
        ("logreg", "fastnn-fused"): "not run: the dry run has no GPU",
        ("mlp-1024", "fastnn-fused"): "not run: the dry run has no GPU",
    }
    md = out.read_text()
    assert "| workload | contender | cold | warm | warm again | training (warm) |" in md
    assert re.search(r"\| logreg \| numpy-cpu \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", md)
    assert "### logreg · numpy-cpu" in md and "### logreg · fastnn-fused" not in md
    import bench_setup

    for phase in bench_setup.PHASES:
        assert re.search(rf"\| {re.escape(phase)} \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", md), phase


def test_each_pair_has_its_own_compile_caches_emptied_for_its_cold_run(tmp_path):
    """Every cache a worker's libraries fill lies in its (contender, workload) folder, which the cold run empties.
    NVRTC 12.9+ keeps every program it compiles in the CUDA compute cache (~/.nv/ComputeCache unless CUDA_CACHE_PATH
    says otherwise), keyed by source and options: left shared, the forced fused and grid engines' "cold" runs of
    issue 26's table on an H100 found the kernels engine="auto" had compiled before them (0.44-0.51 s against auto's
    1.2-3.0 s for the same kernels)."""
    import end_to_end

    outer = {"CUDA_CACHE_PATH": "/shared/nv", "FASTNN_CACHE_DIR": "/shared/fastnn", "PATH": os.environ["PATH"]}
    by = {c.name: c for c in wl.CONTENDERS}
    folders = {}
    for name in ("fastnn-mixed", "fastnn-fused", "torch-graph-amp"):
        for workload in ("logreg", "mlp-128"):
            env = end_to_end.cache_env(by[name], workload, "warm", tmp_path, dict(outer))
            root = tmp_path / name / workload
            for var in ("CUDA_CACHE_PATH", "FASTNN_CACHE_DIR", "FASTNN_DATASET_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                        "TRITON_CACHE_DIR"):  # fmt: skip
                assert Path(env[var]).parent == root, (name, workload, var, env.get(var))
            folders[name, workload] = env["CUDA_CACHE_PATH"]
    assert len(set(folders.values())) == len(folders)


def test_setup_benchmark_table_of_failed_and_partial_runs():
    import bench_setup

    marks = {"process_start": 0.02, "imported": 0.2, "harness_ready": 0.25, "data_loaded": 0.3, "trained": 1.25}
    ok = {"status": "ok", "process_seconds": 1.5, "train_seconds": 0.005, "marks": marks}
    p = bench_setup.phases(ok)
    assert p["import"] == pytest.approx(0.18) and p["dataset load"] == pytest.approx(0.05)
    assert p["set-up + first epoch"] == pytest.approx(0.95) and p["whole process"] == 1.5
    rows = [{"workload": "logreg", "contender": "fastnn-fused", "mode": "cold", **ok},
            {"workload": "logreg", "contender": "fastnn-fused", "mode": "warm", "status": "error", "error": "boom"},
            {"workload": "logreg", "contender": "fastnn-fused", "mode": "warm again", **ok}]  # fmt: skip
    md = bench_setup.markdown(rows, "NVIDIA H100")
    assert "(NVIDIA H100)" in md and "| logreg | fastnn-fused | 1.50 | error | 1.50 | - |" in md
    assert "| import | 0.18 | - | 0.18 |" in md and "warm: boom" in md
    with pytest.raises(SystemExit, match="nope"):
        bench_setup.run(bench_setup.parse_args(["--out", "x.md", "--only", "nope"]))


def test_end_to_end_times_the_users_set_up_not_the_harness_check(monkeypatch):
    """The end-to-end worker's trainer is built as a user builds it: the harness's check of the initial weights
    (a second draw of every value, the whole state read back) is left to the speed benchmark."""
    import end_to_end
    import fastnn_contenders

    def second_draw(*args):
        raise AssertionError("the end-to-end clock drew the initial weights a second time")

    monkeypatch.setattr(fastnn_contenders, "init_parameters", second_draw)
    w = wl.Workload("t", (784, 16, 10), lr=0.05, batch_size=32, samples=100, epochs=1)
    contender = {c.name: c for c in wl.CONTENDERS}["numpy-cpu"]
    adapter = end_to_end._Fastnn(contender, w, _tiny_data())
    assert adapter.trainer.engine == "numpy"
    adapter.close()
    with pytest.raises(AssertionError, match="second time"):  # the speed benchmark's trainer is still checked
        fastnn_contenders.make_trainer(contender, w)


def test_setup_benchmark_byte_compiles_fastnn_as_an_install_does(tmp_path, monkeypatch):
    """Every process of the set-up table imports fastnn from .pyc files, as from a pip install (which compiles them),
    even where PYTHONDONTWRITEBYTECODE keeps the interpreter from writing them."""
    import importlib.util

    import bench_setup

    package = tmp_path / "fastnn"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    (package / "_part.py").write_text("Y = 2\n")
    spec = importlib.util.spec_from_file_location("fastnn", package / "__init__.py")
    monkeypatch.setattr(bench_setup.importlib.util, "find_spec", lambda name: spec)
    assert bench_setup.byte_compile() == package
    assert {p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc")} == {"__init__", "_part"}


def test_nvrtc_benchmark_times_compiles_not_nvrtcs_own_cache(monkeypatch, capsys):
    """Every compile bench_nvrtc.py times runs with NVRTC's cache off (CUDA_CACHE_DISABLE=1): on a machine with a
    driver, NVRTC 12.9+ would otherwise serve the repeats from the CUDA compute cache."""
    import bench_nvrtc

    seen = []

    def run(cmd, **kwargs):
        seen.append((kwargs.get("env") or os.environ).get("CUDA_CACHE_DISABLE"))
        out = json.dumps({"cpu": 1.0, "wall": 1.0, "bytes": 10, "text": "abc"})
        return subprocess.CompletedProcess(cmd, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(bench_nvrtc.subprocess, "run", run)
    monkeypatch.delenv("CUDA_CACHE_DISABLE", raising=False)
    assert bench_nvrtc.main(["--repeats", "2", "--workloads", "logreg", "--variants", "current,--minimal"]) == 0
    assert seen == ["1"] * 4
    capsys.readouterr()


def test_nvrtc_benchmark_tells_debug_info_from_other_code(tmp_path):
    """bench_nvrtc.py on the CPU: -lineinfo makes a larger CUBIN with the same machine code; --Ofast-compile=max
    other machine code. Skipped where NVRTC cannot be loaded."""
    pytest.importorskip("cuda.bindings.nvrtc")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "nvrtc.md"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_nvrtc.py"), "--repeats", "1", "--workloads", "logreg",
         "--variants", "current,-lineinfo (for scale),--Ofast-compile=max", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.read_text().splitlines()[2:]}
    assert rows["current"][-1] == "same |" and rows["-lineinfo (for scale)"][-1] == "same |"
    assert int(rows["-lineinfo (for scale)"][4]) > int(rows["current"][4])  # debug sections, same code
    assert rows["--Ofast-compile=max"][-1] == "other |"


@pytest.mark.bindings
def test_record_benchmark_times_a_steps_calls_on_the_cpu():
    """bench_record.py runs on the CPU (the libraries stubbed) and reports every call of a recorded step."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(BENCH / "bench_record.py"), "--calls", "20"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rows = dict(re.findall(r"\| (\w+) \| ([0-9.]+) \|", res.stdout))
    assert set(rows) == {"matmul", "softmax", "loss", "update", "step"} and all(float(v) > 0 for v in rows.values())
    assert "an epoch of 1,875 steps" in res.stdout


def test_bench_fused_reads_the_grid_kernels_phase_profile_per_step():
    """bench_fused.py --phases: the grid context's cycle sums divided by the steps the kernel counted, named by the
    kernel that ran; None for another engine."""
    import types

    import bench_fused

    ctx = types.SimpleNamespace(phase_names=lambda: ("R1", "F1"), phase_cycles=lambda: np.array([300, 600, 3, 12]))
    grid = types.SimpleNamespace(engine="grid", _engine=types.SimpleNamespace(train_context=ctx))
    assert bench_fused.grid_phases(grid) == {"R1": 100.0, "F1": 200.0}
    assert bench_fused.grid_phases(types.SimpleNamespace(engine="fused", _engine=None)) is None
    assert bench_fused.tuning_of("grid", phases=True).grid_profile is True


def test_first_and_second_fit_evaluate_dry_run(tmp_path):
    """bench_setup.py --fit-evaluate (issue 41) on the CPU: one fresh process per mode, cold from emptied caches,
    each timing two rounds of Trainer, fit, evaluate and close; the table gives the first over the second."""
    stale = tmp_path / "cache" / "numpy-cpu" / "logreg" / "fastnn" / "stale"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "fe.md"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_setup.py"), "--dry-run", "--fit-evaluate", "--only",
         "numpy-cpu,fastnn-fused,torch-graph-amp", "--workloads", "logreg", "--out", str(out), "--cache-dir",
         str(tmp_path / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert not stale.exists()
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert [(r["contender"], r["mode"]) for r in ok] == [("numpy-cpu", "cold"), ("numpy-cpu", "warm")]
    for r in ok:
        assert r["engine"] == "numpy" and len(r["rounds"]) == 2
        for rnd in r["rounds"]:
            assert all(rnd[k] > 0 for k in ("trainer", "fit", "evaluate", "close")) and 0 <= rnd["accuracy"] <= 1
    skipped = {r["contender"]: r["error"] for r in rows if r["status"] == "skipped"}
    assert skipped == {"fastnn-fused": "not run: the dry run has no GPU",
                       "torch-graph-amp": "not run: fastnn's engines only"}  # fmt: skip
    md = out.read_text()
    assert "| logreg | numpy-cpu | cold | numpy |" in md and "1st / 2nd fit + evaluate" in md
