"""Hidden layers' bias gradients from a column-sum kernel after the weight-gradient GEMM, against the graph
engine's choice: cuBLASLt's BGRADB epilogue on that GEMM.

    python benchmarks/kernels/colsum.py [--repeats 1000]

Result (an H200, bench_kernels.py per node, MLP 784-4096x3-10, "mixed"; benchmarks/NOTES.md, "Steps taken"):
the kernel took about 5 us off each hidden layer's weight-gradient GEMM and cost about 1.5 us itself, and the
whole step stayed the same (262 us either way). BGRADB stayed: the same step with one node fewer per layer. The
kernel left the product (it was native/loss.cu's colsum_f16 / colsum_f32, chosen by the engine's
HIDDEN_BIAS_GRAD = "kernel"); it lives here, with a NumPy reference, a check and a timing sweep, as llm.c's
dev/cuda does, so the measurement can be repeated.

Each variant is checked against NumPy (fp16 gradients, so a tolerance of fp16 sums), then timed as the engine
runs it: `repeats` copies captured in one graph, one replay timed (fastnn.cuda.driver.time_captured).
"""

from __future__ import annotations

import argparse

import numpy as np

#: The kernel as it was in native/loss.cu. Launch: grid = ceil(cols / 128), block = 128; a thread per column.
SOURCE = r"""
#include "common.cuh"
// Column sums of a row-major (rows, cols) matrix: the bias gradient where no cuBLASLt epilogue gives it.
template <typename T>
__device__ void colsum(const T* __restrict__ m, int rows, int cols, T* __restrict__ out) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.f;
    for (int r = 0; r < rows; ++r) s += to_f(m[(u64)r * cols + j]);
    out[j] = from_f<T>(s);
}
extern "C" __global__ void colsum_f16(const half_t* m, int rows, int cols, half_t* out) { colsum(m, rows, cols, out); }
extern "C" __global__ void colsum_f32(const float* m, int rows, int cols, float* out) { colsum(m, rows, cols, out); }
"""
THREADS = 128

#: (d_in, d_out, rows) of a hidden layer's weight-gradient GEMM: bench_kernels.py's MLP workloads.
SHAPES = [(128, 128, 32), (4096, 4096, 32), (4096, 4096, 8192)]


def compile_kernel(arch: str) -> bytes:
    """The kernel's CUBIN for `arch` (NVRTC, with native/ on the include path); needs no GPU."""
    from fastnn.cuda import nvrtc

    return nvrtc.compile_source(SOURCE, "colsum.cu", arch, include_dirs=[nvrtc.native_dir()])


def reference(dz: np.ndarray) -> np.ndarray:
    """The bias gradient: column sums of the row-major (rows, d_out) dZ, in float64."""
    return dz.astype(np.float64).sum(axis=0)


def measure(d_in: int, d_out: int, rows: int, repeats: int) -> dict[str, float]:
    """Check both variants against NumPy, then time (us) the GEMM with BGRADB, without it, and the kernel."""
    from fastnn.cuda import cublaslt as lt
    from fastnn.cuda import driver
    from fastnn.cuda.driver import arg_i32, arg_ptr

    dev = driver.get_device(0)
    dev.make_current()
    rng = np.random.default_rng(0)
    h = rng.normal(size=(rows, d_in)).astype(np.float16)  # the layer's input H (rows, d_in)
    dz = rng.normal(size=(rows, d_out)).astype(np.float16)  # dL/dZ (rows, d_out)
    with driver.Stream(dev) as stream, lt.Handle() as handle:
        workspace = lt.Workspace(32 << 20)
        kernel = driver.Module(compile_kernel(dev.arch)).function("colsum_f16")
        bufs = {name: driver.DeviceBuffer(max(nbytes, 256)) for name, nbytes in
                (("h", h.nbytes), ("dz", dz.nbytes), ("dw", d_in * d_out * 2), ("db", d_out * 2))}  # fmt: skip
        bufs["h"].upload(h)
        bufs["dz"].upload(dz)

        def plan(epilogue: lt.Epilogue) -> lt.Matmul:  # dW^T (d_in, d_out) = H^T @ dZ, as the engine's wgrad
            return lt.Matmul(handle, d_in, d_out, rows, transa=False, transb=True, ab_type=lt.DataType.R_16F,
                             cd_type=lt.DataType.R_16F, compute=lt.ComputeType.COMPUTE_32F, lda=d_in, ldb=d_out,
                             ldc=d_in, epilogue=epilogue, workspace=workspace, max_algos=1)  # fmt: skip

        bgradb, default = plan(lt.Epilogue.BGRADB), plan(lt.Epilogue.DEFAULT)
        dw, db = bufs["dw"].ptr, bufs["db"].ptr

        def gemm(p: lt.Matmul, bias: int = 0) -> None:
            p(bufs["h"].ptr, bufs["dz"].ptr, dw, dw, stream, bias=bias)

        def colsum() -> None:
            args = [arg_ptr(bufs["dz"].ptr), arg_i32(rows), arg_i32(d_out), arg_ptr(db)]
            kernel.launch((-(-d_out // THREADS), 1, 1), (THREADS, 1, 1), args, stream)

        want = reference(dz)
        tol = 1e-2 * np.sqrt(rows) + 1e-3 * np.abs(want)
        for name, run in (("bgradb", lambda: gemm(bgradb, db)), ("kernel", colsum)):
            bufs["db"].memset(0xFF)  # NaN: a variant that writes nothing fails
            run()
            stream.synchronize()
            got = np.empty(d_out, dtype=np.float16)
            bufs["db"].download(got)
            assert np.all(np.abs(got.astype(np.float64) - want) <= tol), f"{name}: bias gradient differs from NumPy"
        us = {
            "wgrad+BGRADB": driver.time_captured(stream, lambda: [gemm(bgradb, db) for _ in range(repeats)]),
            "wgrad": driver.time_captured(stream, lambda: [gemm(default) for _ in range(repeats)]),
            "colsum kernel": driver.time_captured(stream, lambda: [colsum() for _ in range(repeats)]),
        }
        for b in bufs.values():
            b.close()
        bgradb.close()
        default.close()
        workspace.close()
    return {name: ms * 1000.0 / repeats for name, ms in us.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1000)
    args = ap.parse_args()
    print(f"{'d_in x d_out, rows':24s} {'wgrad+BGRADB':>13s} {'wgrad':>8s} {'colsum':>8s} {'kernel path':>12s}  (us)")
    for d_in, d_out, rows in SHAPES:
        t = measure(d_in, d_out, rows, args.repeats)
        print(f"{f'{d_in} x {d_out}, {rows}':24s} {t['wgrad+BGRADB']:13.2f} {t['wgrad']:8.2f} "
              f"{t['colsum kernel']:8.2f} {t['wgrad'] + t['colsum kernel']:12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
