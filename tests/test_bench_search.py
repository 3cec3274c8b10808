"""benchmarks/bench_search.py's dry run: every contender's path on the CPU (tiny data), the real search's plan
(4 many-model fits of 80 models), the Optuna round and the JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_the_dry_run_runs_every_contender(tmp_path):
    out = tmp_path / "search.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_search.py"), "--dry-run", "--optuna", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    text = res.stdout
    assert "plan of the real search: 4 many-model fits of [80, 80, 80, 80] models" in text
    assert "8 candidates x 5 folds" in text and "dry run: done" in text
    for name in ("fastnn-search", "sklearn-search-fastnn", "sklearn-cpu"):
        assert f"\n{name} " in text
    assert "2 many-model fits of [20, 20] models, 0 fits fell back" in text
    assert "max |mean_test_score difference| 0.0000 over 2 candidates; best_params_ the same" in text
    assert "optuna round of 32 trials" in text
    saved = json.loads(out.read_text())
    assert set(saved["contenders"]) == {"fastnn-search", "sklearn-search-fastnn", "sklearn-cpu"}
    assert saved["optuna"]["trials"] == 32
