"""What `import fastnn` and a CPU trainer load: no network stack (only a download needs it) and no CUDA library
(only a GPU engine needs them). Each check runs in a fresh interpreter, whose sys.modules and mapped shared
libraries are then read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

#: Modules that only a download needs (urllib.request pulls in http.client, email, ssl and socket).
NETWORK = ("http.client", "urllib.request", "email", "ssl", "socket")
#: fastnn's bindings and GPU engines, and the CUDA Python bindings they import.
CUDA_MODULES = ("cuda.bindings", "fastnn.cuda", "fastnn.engine.graph.engine", "fastnn.engine.fused.engine")
#: Shared libraries loaded through ctypes or cuda-bindings (as named in /proc/self/maps).
CUDA_LIBRARIES = ("libcuda.", "libcudart", "libcublas", "libcudnn", "libnccl", "libnvrtc")

_PROBE = """
import json, sys
{body}
maps = open("/proc/self/maps").read() if sys.platform == "linux" else ""
print(json.dumps({{"modules": sorted(sys.modules), "maps": maps}}))
"""


def _loaded(body: str) -> tuple[list[str], str]:
    """(sys.modules, /proc/self/maps) of a fresh interpreter after running `body`."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)], capture_output=True, text=True, env=env, cwd=REPO,
        timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.splitlines()[-1])
    return result["modules"], result["maps"]


def _offenders(modules: list[str], maps: str) -> list[str]:
    bad = [m for m in modules if any(m == p or m.startswith(p + ".") for p in NETWORK + CUDA_MODULES)]
    bad += [lib for lib in CUDA_LIBRARIES if lib in maps]
    return bad


def test_import_fastnn_loads_no_network_stack_and_no_cuda():
    modules, maps = _loaded("import fastnn")
    assert "fastnn._trainer" in modules  # the probe did import fastnn
    assert _offenders(modules, maps) == []


#: What `import fastnn` leaves to first use: the datasets module (hashing, JSON, gzip, the decoded cache) and the
#: checkpoint files (zipfile), with the standard modules only they need.
DEFERRED = ("fastnn.datasets", "fastnn._decoded", "fastnn._idx", "fastnn._checkpoint", "zipfile", "gzip", "hashlib")


def test_import_fastnn_defers_datasets_and_checkpoints_to_first_use():
    modules, _ = _loaded("import fastnn")
    assert [m for m in DEFERRED if m in modules] == []


def test_the_deferred_modules_load_on_first_use_through_every_public_spelling():
    body = """
import fastnn
assert "datasets" in dir(fastnn)
loaded = fastnn.datasets.load  # attribute access imports it
from fastnn import datasets
import fastnn.datasets as again
assert datasets is again is fastnn.datasets and datasets.load is loaded
try:
    fastnn.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("fastnn.no_such_name did not raise")
"""
    modules, _ = _loaded(body)
    assert "fastnn.datasets" in modules


def test_a_cpu_trainer_and_a_local_dataset_load_no_network_stack_and_no_cuda(tmp_path):
    folder = tmp_path / "data"
    body = f"""
import os
import numpy as np
import fastnn
from fastnn import datasets
rng = np.random.default_rng(0)
x, y = rng.integers(0, 256, (64, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64, dtype=np.uint8)
os.makedirs({str(folder)!r})
for stem, arr in zip({STEMS!r}, (x, y, x, y)):
    datasets.write_idx(os.path.join({str(folder)!r}, stem + ".gz"), arr)
xs, ys, _, _ = datasets.load("mnist", root={str(folder)!r}, download=False, verify=False)
fastnn.Trainer(fastnn.MLP([784, 8, 10]), device="cpu", batch_size=16, precision="fp32").fit(xs, ys, epochs=1)
"""
    modules, maps = _loaded(body)
    assert "fastnn.engine.numpy_engine" in modules  # the probe did train on the CPU
    assert _offenders(modules, maps) == []
