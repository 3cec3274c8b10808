"""What a process that used fastnn's CUDA bindings does at exit (issue 41): the garbage collector's last passes skip
the objects alive then (fastnn/cuda/_exit.py); on the CPU, in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bindings  # imports fastnn.cuda.driver (cuda-bindings); no GPU needed
pytest.importorskip("cuda.bindings", reason="needs the CUDA wheels")

REPO = Path(__file__).resolve().parents[1]

# The hook registered first runs last (atexit is last in, first out): it sees what fastnn's hook left.
_PROBE = """
import atexit, gc, sys
atexit.register(lambda: sys.stdout.write(f"frozen at exit: {gc.get_freeze_count() > 0}"))
BODY
"""


def _exit_report(body: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", _PROBE.replace("BODY", body)], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_process_that_loaded_the_cuda_bindings_skips_the_final_collection():
    assert _exit_report("import fastnn.cuda.driver") == "frozen at exit: True"


def test_a_cpu_only_process_keeps_it():
    assert _exit_report("import fastnn; fastnn.Trainer(fastnn.MLP([4, 2]), device='cpu')") == "frozen at exit: False"
