"""benchmarks/kernels/batch/ on the CPU (issue 38): the budget model reproduces the measured batch-32 step it is
built on and the byte counts the grid engine's design states, the probe's output is parsed into tables and
constants, and the probe builds for sm_90a where nvcc is on PATH (it runs only on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BATCH = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels" / "batch"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"batch_{name}", BATCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


budget = _load("budget")
run_probe = _load("run_probe")


@pytest.mark.parametrize("h", [256, 1024, 4096])
def test_the_model_at_batch_32_is_the_measured_step(h):
    """Each phase of today's 1-D partition at batch 32 is the measured phase (grid-engine.md's profile), or the
    model's throughput where that is larger: the latency it keeps is what was measured."""
    one_d = budget.partitions(h, 32)[0]
    assert one_d.name == "1-D" and one_d.rows == 32
    phases = budget.budget(h, 32, one_d)
    measured = budget.MEASURED_B32[h]
    assert [p.name for p in phases] == list(budget.PHASES)
    for p in phases:
        assert p.cycles >= measured[p.name] - 1e-6
        assert p.cycles == pytest.approx(max(measured[p.name], p.cycles - p.latency))
    total = sum(p.cycles for p in phases)
    assert total == pytest.approx(sum(measured.values()), rel=0.06 if h == 4096 else 1e-9)


def test_hbm_bytes_at_4096_are_the_streaming_kernels():
    """The 1-D streamed step moves 428.7 MB of HBM a step at h = 4096 (grid-engine.md: 12 B a parameter for W1
    and W2, 8 B for W0; the head's 0.4 MB the model leaves out), whatever the batch."""
    for batch in (32, 512):
        phases = budget.budget(4096, batch, budget.partitions(4096, batch)[0])
        assert sum(p.hbm for p in phases) / 1e6 == pytest.approx(428.7, abs=0.5)


def test_every_candidate_fits_the_gpu_and_covers_the_batch():
    for h in (256, 1024, 4096):
        for batch in (64, 128, 256, 512):
            cands = budget.partitions(h, batch)
            names = {p.name for p in cands}
            assert {"1-D", "1-D mcast S=2", "1-D, split head"} <= names
            assert any(n.startswith("2-D") for n in names) and any(n.startswith("split") for n in names)
            for p in cands:
                assert p.ctas <= budget.Costs().sms
                assert p.pu * p.nb == h and p.pb * p.rows == batch and p.rows % 16 == 0 and p.nb % 8 == 0
                assert budget.fits_on_chip(h, p) or p.masters != "chip"


def test_more_rows_never_make_a_step_cheaper():
    costs = budget.Costs()
    for h in (256, 1024, 4096):
        times = [budget.step_us(h, b, budget.partitions(h, b, costs)[0], costs) for b in (32, 64, 128, 256, 512)]
        assert times == sorted(times)


FAKE = [
    json.dumps({"device": "NVIDIA H100 80GB HBM3", "sms": 132, "l2_bytes": 52428800, "smem_per_block_optin": 232448}),
    json.dumps({"probe": "round", "ctas": 132, "bytes": 16384, "groups": 1, "barrier": 1, "consume": 1,
                "cycles": 2400.0, "cycles_max": 2600.0, "ns": 1300.0, "ghz": 1.8, "bytes_per_clk_per_sm": 6.8}),
    json.dumps({"probe": "bcast", "ctas": 132, "bytes": 16384, "groups": 1, "barrier": 0, "consume": 1,
                "cycles": 500.0, "cycles_max": 600.0, "ns": 300.0, "ghz": 1.8, "bytes_per_clk_per_sm": 32.8}),
    json.dumps({"probe": "bcast", "ctas": 132, "bytes": 262144, "groups": 1, "barrier": 0, "consume": 1,
                "cycles": 5242.0, "cycles_max": 5400.0, "ns": 2900.0, "ghz": 1.8, "bytes_per_clk_per_sm": 50.0}),
    json.dumps({"probe": "mcast", "cluster": 4, "ctas": 132, "bytes": 262144, "barrier": 0, "consume": 1,
                "cycles": 2300.0, "cycles_max": 2500.0, "ns": 1300.0, "ghz": 1.8, "bytes_per_clk_per_sm": 114.0}),
    json.dumps({"probe": "dsmem", "op": "all-reduce", "cluster": 2, "ctas": 132, "bytes": 32768, "inbound": 32768,
                "cycles": 2200.0, "cycles_max": 2300.0, "ghz": 1.8, "inbound_bytes_per_clk": 14.9}),
    json.dumps({"probe": "mma", "what": "2-D fwd: rows x NB, K = h", "R": 128, "N": 32, "K": 1024, "MT": 2, "NT": 4,
                "cycles": 4000.0, "cycles_max": 4100.0, "ghz": 1.8, "fma_per_clk_per_sm": 1064.0,
                "smem_bytes_per_clk": 90.0}),
    "batch_probe: stuck on mbarrier 0x400 parity 1 iteration 3 block 7 thread 0",
    json.dumps({"failed": "mma", "rc": 134, "stderr": "trap"}),
]  # fmt: skip


def test_probe_lines_become_tables_and_constants():
    rows = run_probe.parse(FAKE + ["{not json"])
    assert len(rows) == 8  # the watchdog's message and the broken line are skipped
    text = run_probe.tables(rows)
    for head in ("Exchange round", "TMA multicast", "DSMEM reduction", "mma.sync tile loops", "Failed parts"):
        assert head in text
    assert "| 16 KB | 2,400 / 2,600 |" in text and "1,900" in text  # round less the read alone
    assert "| 4 | 132 | 256 KB | no | 2,300 / 2,500 | 114.0 | 2.28x |" in text
    costs = budget.load_probe(FAKE)
    assert costs.l2_bcast == 50.0 and costs.ghz == 1.8
    assert costs.mcast == {2: 57.0, 4: 114.0, 8: 57.0}  # clusters the probe did not measure keep the estimate
    assert costs.dsmem_rate == 14.9 and costs.mma_eff == pytest.approx(0.8)
    assert costs.round_fixed == pytest.approx((2400 - 16384 / 50.0) * 1.2)


def test_set_overrides_a_constant_and_refuses_a_bad_one():
    costs = budget.override(budget.Costs(), ["mma_eff=0.8", "mcast=100"])
    assert costs.mma_eff == 0.8 and set(costs.mcast.values()) == {100.0}
    for bad in ("mma=0.8", "mma_eff=fast", "mma_eff"):
        with pytest.raises(SystemExit, match="--set"):
            budget.override(budget.Costs(), [bad])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_the_probe_builds_for_sm90_without_spills(tmp_path):
    res = subprocess.run(["nvcc", *run_probe.NVCC, "-o", str(tmp_path / "p"), str(BATCH / "batch_probe.cu")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr
    spills = [line for line in res.stderr.splitlines() if "spill stores" in line]
    assert spills and all(" 0 bytes spill stores, 0 bytes spill loads" in line for line in spills)


def test_each_part_runs_in_its_own_process_and_a_failure_is_a_row(tmp_path):
    """run_probe.run: a part that exits non-zero or outlives its limit leaves its lines and a "failed" row, and the
    parts after it still run."""
    fake = tmp_path / "batch_probe"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "{\\"probe\\": \\"$1\\"}"\n'
        'if [ "$1" = mcast ]; then echo "batch_probe: stuck" >&2; exit 134; fi\n'
        'if [ "$1" = dsmem ]; then sleep 5; fi\n'
    )
    fake.chmod(0o755)
    rows = run_probe.parse(run_probe.run(fake, ["round", "mcast", "dsmem", "mma"], limit=1.0))
    assert [r.get("probe") for r in rows if "probe" in r] == ["round", "mcast", "dsmem", "mma"]
    failed = {r["failed"]: r["rc"] for r in rows if "failed" in r}
    assert failed == {"mcast": 134, "dsmem": "timeout"}
