"""The loss as the kernels compute it: native/loss.cuh against fastnn._loss (the NumPy engine's definition).

Like tests/test_optim_kernel.py for the optimizer: the kinds agree, every kernel takes its loss arithmetic from the
header (no kernel computes an exponential or a logarithm of its own), the engines name no loss, and the header's
per-row functions, compiled for the CPU (g++, -DLOSS_HOST: the same source with libm's expf/logf and a division
where the GPU takes __expf/__logf/__fdividef), give the NumPy functions' losses and gradients on random rows: this
pins the arithmetic (each operation, its order and constants), not the GPU's last bits. The `bindings` test
compiles the header for the GPU with NVRTC and checks the kinds there too."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fastnn._loss as loss

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"
KINDS = {"LOSS_" + k.removeprefix("KIND_"): v for k, v in vars(loss).items() if k.startswith("KIND_")}


def test_the_kinds_are_the_headers():
    header = (NATIVE / "loss.cuh").read_text()
    defined = {m[0]: int(m[1]) for m in re.findall(r"^#define (LOSS_[A-Z]+) (\d+)", header, re.M)}
    assert defined == KINDS == {"LOSS_XENT": 0, "LOSS_MSE": 1, "LOSS_WXENT": 2, "LOSS_HUBER": 3}
    assert {d.kind for d in loss.LOSSES.values()} <= set(KINDS.values())
    assert all(loss.describe(name).name == name for name in loss.LOSSES)


def test_every_kernel_takes_its_loss_arithmetic_from_the_header():
    """One rounding: no kernel file calls expf/logf (or the fast __expf/__logf/__fdividef) but loss.cuh, and each
    kernel that computes a loss includes it."""
    for path in sorted(NATIVE.glob("*.cu*")):
        if path.name == "loss.cuh":
            continue
        code = re.sub(r"//.*", "", path.read_text())
        assert not re.search(r"\b(__)?(expf|logf|fdividef)\s*\(", code), path.name
    for name in ("loss.cu", "fused.cu", "fused_head.cuh", "grid_tc.cuh"):
        assert '#include "loss.cuh"' in (NATIVE / name).read_text(), name


def _engine_sources() -> list[Path]:
    """The GPU engines' modules (the NumPy engine computes each loss, so it may name them)."""
    return sorted(p for p in (REPO / "fastnn" / "engine").rglob("*.py") if p.name != "numpy_engine.py")


@pytest.mark.parametrize("path", [str(p.relative_to(REPO)) for p in _engine_sources()])
def test_gpu_engines_compare_no_loss_name(path):
    """They ask the loss's description (labels, softmax, kind), never `config.loss == "mse"` (a new loss must not
    touch them)."""
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            assert not set(names) & set(loss.LOSSES), (path, node.lineno)


# ---- loss.cuh on the CPU (g++), against the NumPy definitions ------------------------------------------------------
_DRIVER = r"""
#include <cstdio>
#include "loss.cuh"
static const int B = %(B)d, C = %(C)d;
static const float Z[B * C] = {%(z)s};
static const int Y[B] = {%(y)s};
static const float W[B] = {%(w)s};
static const float T[B * C] = {%(t)s};
static void xent(int weighted, float wsum) {  // the order of loss.cu's xent: one row at a time
    for (int r = 0; r < B; ++r) {
        const float* z = Z + r * C;
        float zmax = z[0];
        for (int j = 1; j < C; ++j) zmax = z[j] > zmax ? z[j] : zmax;
        float sum = 0.f;
        for (int j = 0; j < C; ++j) sum = xent_add(sum, xent_exp(z[j], zmax));
        const float inv = xent_inv(sum), scale = weighted ? W[r] / wsum : 1.f / B;
        printf("%%.9g", weighted ? wxent_row_loss(W[r], sum, z[Y[r]], zmax) : xent_row_loss(sum, z[Y[r]], zmax));
        for (int j = 0; j < C; ++j)
            printf(" %%.9g", xent_grad(xent_exp(z[j], zmax), inv, j == Y[r] ? 1.f : 0.f, scale));
        printf("\n");
    }
}
int main() {
    printf("%%d %%d %%d %%d\n", LOSS_XENT, LOSS_MSE, LOSS_WXENT, LOSS_HUBER);
    xent(0, 0.f);
    float wsum = 0.f;
    for (int r = 0; r < B; ++r) wsum += W[r];
    xent(1, wsum);
    const float scale = (float)(2.0 / ((double)B * C));
    for (int r = 0; r < B; ++r) {  // mse: the order of loss.cu's mse
        float sq = 0.f;
        for (int j = 0; j < C; ++j) sq = mse_add_sq(sq, mse_diff(Z[r * C + j], T[r * C + j]));
        printf("%%.9g", mse_row_loss(sq, C));
        for (int j = 0; j < C; ++j) printf(" %%.9g", mse_grad(mse_diff(Z[r * C + j], T[r * C + j]), scale));
        printf("\n");
    }
    const float hscale = (float)(1.0 / ((double)B * C)), delta = %(delta)s;
    for (int r = 0; r < B; ++r) {  // huber: the mean over the outputs of each output's loss
        float s = 0.f;
        for (int j = 0; j < C; ++j) s += huber_elem(mse_diff(Z[r * C + j], T[r * C + j]), delta);
        printf("%%.9g", s / (float)C);
        for (int j = 0; j < C; ++j) printf(" %%.9g", huber_grad(mse_diff(Z[r * C + j], T[r * C + j]), delta, hscale));
        printf("\n");
    }
}
"""


def _floats(a: np.ndarray) -> str:
    return ", ".join(f"{float(v)!r}f" for v in a.ravel())


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    """(inputs, the header's outputs parsed): B = 9 rows of C = 7, logits spanning +-30 (exp's range reduction)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build native/loss.cuh for the CPU")
    rng = np.random.default_rng(3)
    B, C = 9, 7
    z = (rng.normal(size=(B, C)) * 10).astype(np.float32)
    z[0, 3] = 30.0  # a confident row
    y = rng.integers(0, C, size=B).astype(np.int32)
    w = rng.uniform(0.1, 3.0, size=B).astype(np.float32)
    t = (z + rng.normal(size=(B, C)) * 2).astype(np.float32)
    t[1] = z[1] + 5  # every error past Huber's delta
    delta = np.float32(1.5)
    src = _DRIVER % {"B": B, "C": C, "z": _floats(z), "y": ", ".join(map(str, y)), "w": _floats(w),
                     "t": _floats(t), "delta": f"{float(delta)!r}f"}  # fmt: skip
    d = tmp_path_factory.mktemp("loss_host")
    (d / "run.cpp").write_text(src)
    exe = d / "run"
    # -ffp-contract=off: no product fused with a sum the header does not fuse itself (loss_fma is the only fma)
    subprocess.run([cxx, "-O2", "-ffp-contract=off", "-DLOSS_HOST", f"-I{NATIVE}", str(d / "run.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    kinds = [int(v) for v in lines[0].split()]
    rows = np.array([[float(v) for v in line.split()] for line in lines[1:]], dtype=np.float64)
    parts = {name: rows[i * B : (i + 1) * B] for i, name in enumerate(("xent", "wxent", "mse", "huber"))}
    return (z, y, w, t, float(delta)), kinds, parts


def test_the_host_build_has_the_kinds(host_run):
    _, kinds, _ = host_run
    assert kinds == [KINDS[k] for k in ("LOSS_XENT", "LOSS_MSE", "LOSS_WXENT", "LOSS_HUBER")]


@pytest.mark.parametrize("name", ["xent", "wxent", "mse", "huber"])
def test_each_loss_of_the_header_is_the_numpy_definition(host_run, name):
    """Per row: the loss and the gradient of the batch's loss, to float32 rounding of a few operations."""
    (z, y, w, t, delta), _, parts = host_run
    z64, t64 = z.astype(np.float64), t.astype(np.float64)
    if name == "xent":
        want, grad = loss.loss_and_grad(z64, y)
    elif name == "wxent":
        want, grad = loss.weighted_loss_and_grad(z64, y, w.astype(np.float64))
    elif name == "mse":
        want, grad = loss.mse_loss_and_grad(z64, t64)
    else:
        want, grad = loss.huber_loss_and_grad(z64, t64, delta)
    got = parts[name]
    np.testing.assert_allclose(got[:, 0], want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got[:, 1:], grad, rtol=2e-5, atol=1e-7)


def test_the_comparison_can_fail(host_run):
    """A gradient off by a sign or by the factor 2 of the squared error is caught at these tolerances."""
    (z, y, w, t, delta), _, parts = host_run
    _, grad = loss.mse_loss_and_grad(z.astype(np.float64), t.astype(np.float64))
    assert not np.allclose(parts["mse"][:, 1:] / 2, grad, rtol=2e-5, atol=1e-7)
    _, grad = loss.loss_and_grad(z.astype(np.float64), y)
    assert not np.allclose(-parts["xent"][:, 1:], grad, rtol=2e-5, atol=1e-7)


# ---- loss.cuh for the GPU (NVRTC, no GPU) ------------------------------------------------------------------------
@pytest.mark.bindings
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_header_compiles_for_the_gpu_with_the_kinds(arch):
    from fastnn.cuda import nvrtc
    from fastnn.cuda._loader import NvrtcError

    def source(kinds: dict[str, int]) -> str:
        lines = ['#include "loss.cuh"']
        lines += [f'static_assert({k} == {v}, "{k}");' for k, v in kinds.items()]
        lines.append('extern "C" __global__ void probe(float* o) { o[0] = xent_row_loss(o[1], o[2], o[3]) + '
                     "mse_grad(o[4], o[5]) + huber_grad(o[6], 1.f, o[7]) + wxent_row_loss(o[8], o[1], o[2], o[3]) + "
                     "xent_grad(xent_exp(o[9], o[3]), xent_inv(o[1]), o[10], o[11]) + huber_elem(o[6], 2.f); }")
        return "\n".join(lines) + "\n"

    nvrtc.compile_source(source(KINDS), "probe.cu", arch, include_dirs=[NATIVE])
    with pytest.raises(NvrtcError, match="LOSS_MSE"):
        nvrtc.compile_source(source(dict(KINDS, LOSS_MSE=7)), "probe.cu", arch, include_dirs=[NATIVE])
