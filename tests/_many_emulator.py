"""A CPU stand-in for the CUDA driver that *runs* native/many.cu's kernels in NumPy, so the many-model GPU engine's
host side (buffers, layout offsets, tables, packed arguments, the captured epoch, divergence and evaluation) runs
end to end on a machine without a GPU, and its results can be compared with the NumPy engine's.

Device memory is one NumPy byte heap; a pointer is an offset into it plus BASE. Each kernel below follows its CUDA
source line for line in NumPy (fp32), reading the same arguments in the same order; a capture records launches and
a graph replays them. The device tests (tests/test_many_gpu.py, marked gpu) check the real kernels the same way.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np

from fastnn._optim import SGD, AdamW, adamw_step, sgd_step
from fastnn._shuffle import ROUNDS, round_keys
from fastnn.engine.many.gpu.layout import rows_at
from fastnn.engine.numpy_engine import activation, activation_grad, log_softmax

BASE = 1 << 24
_M32 = np.uint32(0xFFFFFFFF)


class Heap:
    def __init__(self) -> None:
        self.mem = np.zeros(1 << 20, dtype=np.uint8)
        self.top = 0

    def alloc(self, nbytes: int) -> int:
        at = -(-self.top // 256) * 256
        need = at + max(1, nbytes)
        if need > self.mem.size:
            grown = np.zeros(max(need, 2 * self.mem.size), dtype=np.uint8)
            grown[: self.mem.size] = self.mem
            self.mem = grown
        self.top = need
        return BASE + at

    def view(self, ptr: int, dtype, count: int) -> np.ndarray:
        at = ptr - BASE
        nbytes = np.dtype(dtype).itemsize * count
        assert at >= 0 and at + nbytes <= self.top, f"access outside the heap at {ptr:#x} (+{nbytes})"
        return self.mem[at : at + nbytes].view(dtype)


def make_driver(heap: Heap) -> types.SimpleNamespace:
    """A module with the names the engine uses from fastnn.cuda.driver."""

    class Device:
        ordinal, name, arch, compute_capability, sm_count = 0, "emulated H100", "sm_90", (9, 0), 132

        def make_current(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

    class Stream:
        def __init__(self, device=None) -> None:
            self.recording: list | None = None

        def synchronize(self) -> None:
            pass

        def begin_capture(self) -> None:
            self.recording = []

        def end_capture(self):
            rec, self.recording = self.recording, None
            return Graph(rec)

        def close(self) -> None:
            pass

    class Graph:
        def __init__(self, launches: list) -> None:
            self.launches = launches

        def instantiate(self):
            return GraphExec(self.launches)

        def close(self) -> None:
            pass

    class GraphExec:
        def __init__(self, launches: list) -> None:
            self.launches = launches

        def launch(self, stream) -> None:
            for kernel, grid, args in self.launches:
                with np.errstate(all="ignore"):  # a diverging model overflows, as on the device
                    if grid is None:  # a cuBLASLt call (make_cublaslt)
                        kernel.run(*args)
                    else:
                        KERNELS[kernel](heap, grid, args)

        def close(self) -> None:
            pass

    class Event:
        def __init__(self, timing: bool = False, device=None) -> None:
            pass

        def record(self, stream) -> None:
            pass

        def elapsed_ms(self, end) -> float:
            return 0.5

        def close(self) -> None:
            pass

    class DeviceBuffer:
        def __init__(self, nbytes: int, device=None) -> None:
            self.nbytes = int(nbytes)
            self.ptr = heap.alloc(self.nbytes)
            heap.view(self.ptr, np.uint8, max(1, self.nbytes))[:] = 0xA5  # poisoned, as fresh device memory may be

        def upload(self, array: np.ndarray, stream=None, offset: int = 0) -> None:
            assert offset + array.nbytes <= self.nbytes, "upload past the buffer"
            heap.view(self.ptr + offset, np.uint8, array.nbytes)[:] = np.ascontiguousarray(array).view(np.uint8).ravel()

        def download(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
            assert offset + out.nbytes <= self.nbytes, "download past the buffer"
            out.view(np.uint8).reshape(-1)[:] = heap.view(self.ptr + offset, np.uint8, out.nbytes)
            return out

        def memset(self, byte: int, stream=None) -> None:
            heap.view(self.ptr, np.uint8, self.nbytes)[:] = byte

        def close(self) -> None:
            pass

    class Kernel:
        def __init__(self, name: str) -> None:
            assert name in KERNELS, f"no kernel {name} in many.cu's emulation"
            self.name = name

        def launch(self, grid, block, args, stream, shared_mem: int = 0) -> None:
            if stream.recording is not None:
                stream.recording.append((self.name, grid, list(args)))
            else:
                with np.errstate(all="ignore"):
                    KERNELS[self.name](heap, grid, list(args))

    class Module:
        def __init__(self, cubin, device=None) -> None:
            self.functions: dict[str, Kernel] = {}

        def function(self, name: str) -> Kernel:
            return self.functions.setdefault(name, Kernel(name))

        def close(self) -> None:
            pass

    def copy_dtod(dst: int, src: int, nbytes: int, stream) -> None:
        heap.view(dst, np.uint8, nbytes)[:] = heap.view(src, np.uint8, nbytes).copy()

    def time_captured(stream, record) -> float:  # as fastnn.cuda.driver's: captured, replayed twice
        stream.begin_capture()
        record()
        replay = stream.end_capture().instantiate()
        replay.launch(stream)
        replay.launch(stream)
        return 0.5

    return types.SimpleNamespace(get_device=lambda ordinal=0: Device(), Stream=Stream, Module=Module,
                                 DeviceBuffer=DeviceBuffer, Event=Event, copy_dtod=copy_dtod,
                                 GraphExec=GraphExec, time_captured=time_captured)  # fmt: skip


def make_cublaslt(heap: Heap) -> types.SimpleNamespace:
    """A module with the names the engine uses from fastnn.cuda.cublaslt: Matmul computes column-major
    D (m x n) = op(A) op(B) (+ bias over m, or BGRADB: bias = sums of op(B) over k) in NumPy on the heap."""
    from fastnn.cuda import cublaslt as real

    class Matmul:
        def __init__(self, handle, m, n, k, *, transa, transb, ab_type, cd_type, compute, lda=None, ldb=None,
                     ldc=None, epilogue=real.Epilogue.DEFAULT, workspace=None, **kw) -> None:  # fmt: skip
            self.m, self.n, self.k, self.transa, self.transb = m, n, k, transa, transb
            self.lda = lda or (k if transa else m)
            self.ldb = ldb or (n if transb else k)
            self.ldc = ldc or m
            self.epilogue = epilogue

        def _matrix(self, ptr: int, rows: int, cols: int, ld: int) -> np.ndarray:
            """A column-major (rows, cols) matrix with leading dimension ld."""
            flat = heap.view(ptr, np.float32, ld * (cols - 1) + rows)
            return np.lib.stride_tricks.as_strided(flat, (rows, cols), (4, 4 * ld))

        def __call__(self, a, b, c, d, stream, *, bias=0, aux=0, alpha=1.0, beta=0.0) -> None:
            if module.fail:  # a test's cuBLASLt that refuses to run
                raise real.CublasError(15, "CUBLAS_STATUS_NOT_SUPPORTED", "cublasLtMatmul (emulated)")
            if stream.recording is not None:
                stream.recording.append((self, None, (a, b, c, d, bias, alpha, beta)))
            else:
                self.run(a, b, c, d, bias, alpha, beta)

        def run(self, a, b, c, d, bias, alpha=1.0, beta=0.0) -> None:
            m, n, k = self.m, self.n, self.k
            op_a = self._matrix(a, k, m, self.lda).T if self.transa else self._matrix(a, m, k, self.lda)
            op_b = self._matrix(b, n, k, self.ldb).T if self.transb else self._matrix(b, k, n, self.ldb)
            out = np.float32(alpha) * (op_a @ op_b)
            if beta:
                out = out + np.float32(beta) * self._matrix(c or d, m, n, self.ldc)
            if self.epilogue == real.Epilogue.BIAS:
                out = out + heap.view(bias, np.float32, m)[:, None]
            elif self.epilogue == real.Epilogue.BGRADB:
                heap.view(bias, np.float32, n)[:] = op_b.sum(axis=0)
            else:
                assert self.epilogue == real.Epilogue.DEFAULT, self.epilogue
            self._matrix(d, m, n, self.ldc)[:] = out

        def autotune(self, a, b, c, d, stream, *, bias=0, aux=0, alpha=1.0, beta=0.0, repeats=20) -> float:
            """As cuBLASLt's: the candidates run on these buffers (here once), the choice kept."""
            assert stream.recording is None, "autotune inside a capture"
            self.run(a, b, c, d, bias, alpha, beta)
            module.autotuned += 1
            return 0.5

        def close(self) -> None:
            pass

    class Plain:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def close(self) -> None:
            pass

    module = types.SimpleNamespace(Matmul=Matmul, Handle=Plain, Workspace=Plain, ComputeType=real.ComputeType,
                                   DataType=real.DataType, Epilogue=real.Epilogue, CublasError=real.CublasError,
                                   fail=False, autotuned=0)  # fmt: skip
    return module


# ---- the kernels ------------------------------------------------------------------------------------------------


def _v(arg) -> int | float:
    value = arg.value
    return 0 if value is None else value


def _step(arg) -> dict:
    return {name: getattr(arg, name) for name, _ in arg._fields_}


def _model_rows(heap: Heap, st: dict, k: int) -> tuple[int, int]:
    s = int(heap.view(st["model_stream"] + 4 * k, np.int32, 1)[0])
    if s < 0:
        return 0, s
    g = int(heap.view(st["stream_group"] + 4 * s, np.int32, 1)[0])
    n = int(heap.view(st["group_n"] + 4 * g, np.uint32, 1)[0])
    return rows_at(n, st["step"], st["batch"], bool(st["drop_last"])), s


def _mix32(x: np.uint32) -> np.uint32:
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))


def _permuted(keys: np.ndarray, half: int, n: int, pos: int) -> int:
    """shuffle.cuh's permuted_index, with the half bit count the host put in the group's table."""
    mask = np.uint32((1 << half) - 1)
    x = np.uint32(pos)
    while True:
        left, right = x >> np.uint32(half), x & mask
        for r in range(ROUNDS):
            left, right = right, left ^ (_mix32(right ^ keys[r]) & mask)
        x = (left << np.uint32(half)) | right
        if int(x) < n:
            return int(x)


def _gather(src_dtype):
    def run(heap: Heap, grid, args) -> None:
        x, y, yw, d, rows, group_off, st, seed_lo, seed_hi, scale, shift, fscale, fshift, xb, yb = args
        yw, d, st = _v(yw), _v(d), _step(st)
        batch = st["batch"]
        for s in range(grid[1]):
            g = int(heap.view(st["stream_group"] + 4 * s, np.int32, 1)[0])
            n = int(heap.view(st["group_n"] + 4 * g, np.uint32, 1)[0])
            half = int(heap.view(st["group_half"] + 4 * g, np.uint32, 1)[0])
            epoch = int(heap.view(st["stream_epoch"] + 4 * s, np.uint32, 1)[0])
            off = int(heap.view(_v(group_off) + 8 * g, np.uint64, 1)[0])
            keys = round_keys(_v(seed_lo) | (_v(seed_hi) << 32), epoch)
            for j in range(min(grid[0], rows_at(n, st["step"], batch, bool(st["drop_last"])))):
                pos = st["step"] * batch + j
                idx = _permuted(keys, half, n, pos) if st["shuffled"] else pos
                src = int(heap.view(_v(rows) + 4 * (off + idx), np.int32, 1)[0])
                row = (s * batch + j)
                heap.view(_v(yb) + 4 * row * yw, np.uint32, yw)[:] = heap.view(_v(y) + 4 * src * yw, np.uint32, yw)
                xs = heap.view(_v(x) + np.dtype(src_dtype).itemsize * src * d, src_dtype, d).astype(np.float32)
                if _v(fscale):
                    out = xs * heap.view(_v(fscale), np.float32, d) + heap.view(_v(fshift), np.float32, d)
                else:
                    out = xs * np.float32(_v(scale)) + np.float32(_v(shift))
                heap.view(_v(xb) + 4 * row * d, np.float32, d)[:] = out

    return run


def _input(heap: Heap, xb: int, zin: int, act: str | None, k: int, s: int, batch: int, models: int, fan_in: int,
           rows: int) -> np.ndarray:
    """A layer's input rows of model k: its stream's rows of xb (layer 0), or the previous layer's z activated."""
    if not zin:
        return heap.view(xb + 4 * s * batch * fan_in, np.float32, rows * fan_in).reshape(rows, fan_in)
    z = heap.view(zin, np.float32, rows * models * fan_in).reshape(rows, models, fan_in)[:, k, :]
    return activation(z, act)


def _rows_of(heap: Heap, ptr: int, k: int, models: int, width: int, rows: int) -> np.ndarray:
    """Model k's rows of a (batch, K, width) activation array, as a writable view."""
    return heap.view(ptr, np.float32, rows * models * width).reshape(rows, models, width)[:, k, :]


def _forward(act: str | None):
    def run(heap: Heap, grid, args) -> None:
        xb, zin, fan_in, fan_out, models, params, w_off, b_off, z, st = args
        fan_in, fan_out, models, w_off, b_off, st = (_v(fan_in), _v(fan_out), _v(models), _v(w_off), _v(b_off),
                                                     _step(st))  # fmt: skip
        for k in range(grid[2]):
            rows, s = _model_rows(heap, st, k)
            if rows == 0:
                continue
            a = _input(heap, _v(xb), _v(zin), act, k, s, st["batch"], models, fan_in, rows)
            w = heap.view(_v(params) + 4 * (w_off + k * fan_out * fan_in), np.float32, fan_out * fan_in)
            b = heap.view(_v(params) + 4 * (b_off + k * fan_out), np.float32, fan_out)
            _rows_of(heap, _v(z), k, models, fan_out, rows)[:] = a @ w.reshape(fan_out, fan_in).T + b

    return run


def _xent(heap: Heap, grid, args) -> None:
    z, yb, c, models, dz, hist, st = args
    _xent_models(heap, range(grid[0]), z, yb, c, models, dz, hist, st)


def _xent_tiled(heap: Heap, grid, args) -> None:
    """many_xent_tiled: block b takes models b m .. b m + m - 1 (those below K)."""
    z, yb, c, models, m, dz, hist, st = args
    m = _v(m)
    assert 1 <= m <= 4 and m * _v(c) <= 5120, "a tile many_xent_tiled's shared memory does not hold"
    covered = [k for b in range(grid[0]) for k in range(b * m, min((b + 1) * m, _v(models)))]
    _xent_models(heap, covered, z, yb, c, models, dz, hist, st)


def _xent_models(heap: Heap, ks, z, yb, c, models, dz, hist, st) -> None:
    c, models, st = _v(c), _v(models), _step(st)
    batch = st["batch"]
    for k in ks:
        rows, s = _model_rows(heap, st, k)
        if rows == 0:
            continue
        logits = _rows_of(heap, _v(z), k, models, c, rows)
        labels = heap.view(_v(yb) + 4 * s * batch, np.int32, rows)
        logp = log_softmax(logits)
        h = heap.view(_v(hist) + 16 * k, np.float64, 2)
        h[0] += float(-logp[np.arange(rows), labels].sum(dtype=np.float64))
        h[1] += float((logits.argmax(axis=1) == labels).sum())
        if _v(dz):
            g = np.exp(logp)
            g[np.arange(rows), labels] -= 1.0
            _rows_of(heap, _v(dz), k, models, c, rows)[:] = g / np.float32(rows)


def _mse(heap: Heap, grid, args) -> None:
    z, yb, c, models, dz, hist, sse, st = args
    c, models, st = _v(c), _v(models), _step(st)
    batch = st["batch"]
    for k in range(grid[0]):
        rows, s = _model_rows(heap, st, k)
        if rows == 0:
            continue
        out = _rows_of(heap, _v(z), k, models, c, rows)
        y = heap.view(_v(yb) + 4 * s * batch * c, np.float32, rows * c).reshape(rows, c)
        d = out - y
        heap.view(_v(hist) + 16 * k, np.float64, 2)[0] += float((d * d).mean(axis=1).sum(dtype=np.float64))
        if _v(dz):
            _rows_of(heap, _v(dz), k, models, c, rows)[:] = d * np.float32(2.0 / (rows * c))
        if _v(sse):
            heap.view(_v(sse) + 8 * k * c, np.float64, c)[:] += (d.astype(np.float64) ** 2).sum(axis=0)


def _wgrad(act: str | None):
    def run(heap: Heap, grid, args) -> None:
        xb, zin, fan_in, fan_out, models, dz, grads, w_off, b_off, st = args
        fan_in, fan_out, models, w_off, b_off, st = (_v(fan_in), _v(fan_out), _v(models), _v(w_off), _v(b_off),
                                                     _step(st))  # fmt: skip
        for k in range(grid[2]):
            rows, s = _model_rows(heap, st, k)
            if rows == 0:
                continue
            a = _input(heap, _v(xb), _v(zin), act, k, s, st["batch"], models, fan_in, rows)
            d = _rows_of(heap, _v(dz), k, models, fan_out, rows)
            at = _v(grads) + 4 * (w_off + k * fan_out * fan_in)
            heap.view(at, np.float32, fan_out * fan_in)[:] = (d.T @ a).ravel()
            heap.view(_v(grads) + 4 * (b_off + k * fan_out), np.float32, fan_out)[:] = d.sum(axis=0)

    return run


def _dgrad(act: str):
    def run(heap: Heap, grid, args) -> None:
        dz, fan_in, fan_out, models, params, w_off, zprev, dprev, st = args
        fan_in, fan_out, models, w_off, st = _v(fan_in), _v(fan_out), _v(models), _v(w_off), _step(st)
        for k in range(grid[2]):
            rows, _ = _model_rows(heap, st, k)
            if rows == 0:
                continue
            d = _rows_of(heap, _v(dz), k, models, fan_out, rows)
            w = heap.view(_v(params) + 4 * (w_off + k * fan_out * fan_in), np.float32, fan_out * fan_in)
            zp = _rows_of(heap, _v(zprev), k, models, fan_in, rows)
            _rows_of(heap, _v(dprev), k, models, fan_in, rows)[:] = (d @ w.reshape(fan_out, fan_in)) * activation_grad(
                zp, act)

    return run


_OPT_FIELDS = [("kind", np.int32), ("momentum", np.float32), ("weight_decay", np.float32), ("nesterov", np.int32),
               ("beta1", np.float32), ("beta2", np.float32), ("eps", np.float32),
               ("bias_decay", np.float32)]  # fmt: skip


def _blocks(heap: Heap, starts: int, sizes: int, tensors: int, models: int) -> list[tuple[int, int]]:
    """(first float, floats) of each tensor's block of K models."""
    st = heap.view(starts, np.uint64, tensors + 1)
    sz = heap.view(sizes, np.uint32, tensors)
    return [(int(st[t]), int(sz[t])) for t in range(tensors)]


def _update(heap: Heap, grid, args) -> None:
    w, g, s1, s2, starts, sizes, tensors, skip, opt, lr, lr_stride, step0, st = args
    tensors, models, lr_stride, st, skip = _v(tensors), grid[1], _v(lr_stride), _step(st), _v(skip)
    records = heap.view(_v(opt), np.dtype(_OPT_FIELDS), models)
    blocks = _blocks(heap, _v(starts), _v(sizes), tensors, models)
    for k in range(models):
        rows, _ = _model_rows(heap, st, k)
        if rows == 0:
            continue
        p = records[k]
        rate = float(heap.view(_v(lr) + 4 * (k * lr_stride + st["step"]), np.float32, 1)[0])
        t = int(heap.view(_v(step0) + 8 * k, np.uint64, 1)[0]) + st["step"] + 1
        for t_index, (first, size) in enumerate(blocks):
            if skip >> t_index & 1:
                continue
            at = 4 * (first + k * size)
            wk = heap.view(_v(w) + at, np.float32, size)
            gk = heap.view(_v(g) + at, np.float32, size)
            decay = float(p["bias_decay"] if t_index & 1 else p["weight_decay"])  # weight, bias alternate
            if p["kind"] == 1:
                o = AdamW(lr=rate, betas=(float(p["beta1"]), float(p["beta2"])), eps=float(p["eps"]),
                          weight_decay=decay)  # fmt: skip
                state = {"exp_avg": heap.view(_v(s1) + at, np.float32, size),
                         "exp_avg_sq": heap.view(_v(s2) + at, np.float32, size)}  # fmt: skip
                adamw_step(o, wk, gk, state, rate, t)
            else:
                o = SGD(lr=rate, momentum=float(p["momentum"]), weight_decay=decay,
                        nesterov=bool(p["nesterov"]))  # fmt: skip
                state = {"momentum": heap.view(_v(s1) + at, np.float32, size)} if o.momentum else {}
                sgd_step(o, wk, gk, state, rate)


def _check(heap: Heap, grid, args) -> None:
    w, s1, s2, starts, sizes, tensors, half, bad = args
    tensors, models, half = _v(tensors), grid[1], _v(half)
    flags = heap.view(_v(bad), np.uint32, models)
    blocks = _blocks(heap, _v(starts), _v(sizes), tensors, models)
    with np.errstate(invalid="ignore"):
        for k in range(models):
            for first, size in blocks:
                at = 4 * (first + k * size)
                if not (np.abs(heap.view(_v(w) + at, np.float32, size)) <= (65504.0 if half else
                                                                            np.finfo(np.float32).max)).all():
                    flags[k] |= 1
                for ptr in (_v(s1), _v(s2)):
                    if ptr and not np.isfinite(heap.view(ptr + at, np.float32, size)).all():
                        flags[k] |= 2
                if _v(s2) and (heap.view(_v(s2) + at, np.float32, size) < 0).any():
                    flags[k] |= 4


def _scale_bias(heap: Heap, grid, args) -> None:
    z, params, b_off, out, models, wscale, st = args
    b_off, out, models, st = _v(b_off), _v(out), _v(models), _step(st)
    g = int(heap.view(st["stream_group"], np.int32, 1)[0])
    rows = rows_at(int(heap.view(st["group_n"] + 4 * g, np.uint32, 1)[0]), st["step"], st["batch"],
                   bool(st["drop_last"]))  # fmt: skip
    zz = heap.view(_v(z), np.float32, rows * models * out).reshape(rows, models, out)
    scale = heap.view(_v(wscale), np.float32, models)
    bias = heap.view(_v(params) + 4 * b_off, np.float32, models * out).reshape(models, out)
    zz[:] = scale[None, :, None] * zz + bias[None]


def _fold_sgd(heap: Heap, grid, args) -> None:
    dz, out, models, params, b_off, wscale, opt, lr, lr_stride, st = args
    out, models, b_off, lr_stride, st = _v(out), _v(models), _v(b_off), _v(lr_stride), _step(st)
    records = heap.view(_v(opt), np.dtype(_OPT_FIELDS), models)
    scale = heap.view(_v(wscale), np.float32, models)
    for k in range(models):
        rows, _ = _model_rows(heap, st, k)
        if rows == 0:
            _rows_of(heap, _v(dz), k, models, out, st["batch"])[:] = 0
            continue
        p = records[k]
        rate = np.float32(heap.view(_v(lr) + 4 * (k * lr_stride + st["step"]), np.float32, 1)[0])
        d = _rows_of(heap, _v(dz), k, models, out, rows)
        o = SGD(lr=float(rate), weight_decay=float(p["bias_decay"]))  # the bias's decay
        sgd_step(o, heap.view(_v(params) + 4 * (b_off + k * out), np.float32, out), d.sum(axis=0), {}, float(rate))
        new = scale[k] * (np.float32(1) - rate * p["weight_decay"])
        d *= rate / new
        scale[k] = new


def _unscale(heap: Heap, grid, args) -> None:
    params, w_off, size, wscale = args
    w_off, size = _v(w_off), _v(size)
    scale = heap.view(_v(wscale), np.float32, grid[1])
    for k in range(grid[1]):
        heap.view(_v(params) + 4 * (w_off + k * size), np.float32, size)[:] *= scale[k]


KERNELS = {
    "many_gather_u8": _gather(np.uint8), "many_gather_f32": _gather(np.float32),
    "many_forward_x": _forward(None), "many_forward_relu": _forward("relu"), "many_forward_gelu": _forward("gelu"),
    "many_xent": _xent, "many_mse": _mse, "many_wgrad_x": _wgrad(None), "many_wgrad_relu": _wgrad("relu"),
    "many_wgrad_gelu": _wgrad("gelu"), "many_dgrad_relu": _dgrad("relu"), "many_dgrad_gelu": _dgrad("gelu"),
    "many_update": _update, "many_check": _check, "many_scale_bias": _scale_bias, "many_fold_sgd": _fold_sgd,
    "many_unscale": _unscale, "many_xent_tiled": _xent_tiled, "many_update_vec": _update,
}  # fmt: skip

assert ctypes  # the arguments are ctypes values (fastnn.cuda.driver's arg_*): read with .value / struct fields
