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

    return types.SimpleNamespace(get_device=lambda ordinal=0: Device(), Stream=Stream, Module=Module,
                                 DeviceBuffer=DeviceBuffer, Event=Event, copy_dtod=copy_dtod,
                                 GraphExec=GraphExec)  # fmt: skip


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


def _input(heap: Heap, xb: int, hin: int, k: int, s: int, batch: int, fan_in: int, rows: int) -> np.ndarray:
    base = hin + 4 * k * batch * fan_in if hin else xb + 4 * s * batch * fan_in
    return heap.view(base, np.float32, rows * fan_in).reshape(rows, fan_in)


def _forward(act: str | None):
    def run(heap: Heap, grid, args) -> None:
        xb, hin, fan_in, fan_out, params, stride, w_off, b_off, z, h, st = args
        fan_in, fan_out, stride, w_off, b_off, st = (_v(fan_in), _v(fan_out), _v(stride), _v(w_off), _v(b_off),
                                                     _step(st))  # fmt: skip
        batch = st["batch"]
        for k in range(grid[2]):
            rows, s = _model_rows(heap, st, k)
            if rows == 0:
                continue
            a = _input(heap, _v(xb), _v(hin), k, s, batch, fan_in, rows)
            base = _v(params) + 4 * k * stride
            w = heap.view(base + 4 * w_off, np.float32, fan_out * fan_in).reshape(fan_out, fan_in)
            b = heap.view(base + 4 * b_off, np.float32, fan_out)
            out = a @ w.T + b
            heap.view(_v(z) + 4 * k * batch * fan_out, np.float32, rows * fan_out)[:] = out.ravel()
            if act is not None:
                heap.view(_v(h) + 4 * k * batch * fan_out, np.float32, rows * fan_out)[:] = activation(out, act).ravel()

    return run


def _xent(heap: Heap, grid, args) -> None:
    z, yb, c, dz, hist, st = args
    c, st = _v(c), _step(st)
    batch = st["batch"]
    for k in range(grid[0]):
        rows, s = _model_rows(heap, st, k)
        if rows == 0:
            continue
        logits = heap.view(_v(z) + 4 * k * batch * c, np.float32, rows * c).reshape(rows, c)
        labels = heap.view(_v(yb) + 4 * s * batch, np.int32, rows)
        logp = log_softmax(logits)
        h = heap.view(_v(hist) + 16 * k, np.float64, 2)
        h[0] += float(-logp[np.arange(rows), labels].sum(dtype=np.float64))
        h[1] += float((logits.argmax(axis=1) == labels).sum())
        if _v(dz):
            g = np.exp(logp)
            g[np.arange(rows), labels] -= 1.0
            heap.view(_v(dz) + 4 * k * batch * c, np.float32, rows * c)[:] = (g / np.float32(rows)).ravel()


def _mse(heap: Heap, grid, args) -> None:
    z, yb, c, dz, hist, sse, st = args
    c, st = _v(c), _step(st)
    batch = st["batch"]
    for k in range(grid[0]):
        rows, s = _model_rows(heap, st, k)
        if rows == 0:
            continue
        out = heap.view(_v(z) + 4 * k * batch * c, np.float32, rows * c).reshape(rows, c)
        y = heap.view(_v(yb) + 4 * s * batch * c, np.float32, rows * c).reshape(rows, c)
        d = out - y
        heap.view(_v(hist) + 16 * k, np.float64, 2)[0] += float((d * d).mean(axis=1).sum(dtype=np.float64))
        if _v(dz):
            heap.view(_v(dz) + 4 * k * batch * c, np.float32, rows * c)[:] = (d * np.float32(2.0 / (rows * c))).ravel()
        if _v(sse):
            heap.view(_v(sse) + 8 * k * c, np.float64, c)[:] += (d.astype(np.float64) ** 2).sum(axis=0)


def _wgrad(heap: Heap, grid, args) -> None:
    xb, hin, fan_in, fan_out, dz, grads, stride, w_off, b_off, st = args
    fan_in, fan_out, stride, w_off, b_off, st = (_v(fan_in), _v(fan_out), _v(stride), _v(w_off), _v(b_off),
                                                 _step(st))  # fmt: skip
    batch = st["batch"]
    for k in range(grid[2]):
        rows, s = _model_rows(heap, st, k)
        if rows == 0:
            continue
        a = _input(heap, _v(xb), _v(hin), k, s, batch, fan_in, rows)
        d = heap.view(_v(dz) + 4 * k * batch * fan_out, np.float32, rows * fan_out).reshape(rows, fan_out)
        base = _v(grads) + 4 * k * stride
        heap.view(base + 4 * w_off, np.float32, fan_out * fan_in)[:] = (d.T @ a).ravel()
        heap.view(base + 4 * b_off, np.float32, fan_out)[:] = d.sum(axis=0)


def _dgrad(act: str):
    def run(heap: Heap, grid, args) -> None:
        dz, fan_in, fan_out, params, stride, w_off, zprev, dprev, st = args
        fan_in, fan_out, stride, w_off, st = _v(fan_in), _v(fan_out), _v(stride), _v(w_off), _step(st)
        batch = st["batch"]
        for k in range(grid[2]):
            rows, _ = _model_rows(heap, st, k)
            if rows == 0:
                continue
            d = heap.view(_v(dz) + 4 * k * batch * fan_out, np.float32, rows * fan_out).reshape(rows, fan_out)
            w = heap.view(_v(params) + 4 * (k * stride + w_off), np.float32, fan_out * fan_in).reshape(fan_out, fan_in)
            zp = heap.view(_v(zprev) + 4 * k * batch * fan_in, np.float32, rows * fan_in).reshape(rows, fan_in)
            heap.view(_v(dprev) + 4 * k * batch * fan_in, np.float32, rows * fan_in)[:] = (
                (d @ w) * activation_grad(zp, act)).ravel()

    return run


_OPT_FIELDS = [("kind", np.int32), ("momentum", np.float32), ("weight_decay", np.float32), ("nesterov", np.int32),
               ("beta1", np.float32), ("beta2", np.float32), ("eps", np.float32)]  # fmt: skip


def _update(heap: Heap, grid, args) -> None:
    w, g, s1, s2, stride, count, models, opt, lr, lr_stride, step0, st = args
    stride, count, models, lr_stride, st = _v(stride), _v(count), _v(models), _v(lr_stride), _step(st)
    records = heap.view(_v(opt), np.dtype(_OPT_FIELDS), models)
    for k in range(models):
        rows, _ = _model_rows(heap, st, k)
        if rows == 0:
            continue
        p = records[k]
        rate = float(heap.view(_v(lr) + 4 * (k * lr_stride + st["step"]), np.float32, 1)[0])
        t = int(heap.view(_v(step0) + 8 * k, np.uint64, 1)[0]) + st["step"] + 1
        wk = heap.view(_v(w) + 4 * k * stride, np.float32, count)
        gk = heap.view(_v(g) + 4 * k * stride, np.float32, count)
        if p["kind"] == 1:
            o = AdamW(lr=rate, betas=(float(p["beta1"]), float(p["beta2"])), eps=float(p["eps"]),
                      weight_decay=float(p["weight_decay"]))  # fmt: skip
            state = {"exp_avg": heap.view(_v(s1) + 4 * k * stride, np.float32, count),
                     "exp_avg_sq": heap.view(_v(s2) + 4 * k * stride, np.float32, count)}  # fmt: skip
            adamw_step(o, wk, gk, state, rate, t)
        else:
            o = SGD(lr=rate, momentum=float(p["momentum"]), weight_decay=float(p["weight_decay"]),
                    nesterov=bool(p["nesterov"]))  # fmt: skip
            state = {"momentum": heap.view(_v(s1) + 4 * k * stride, np.float32, count)} if o.momentum else {}
            sgd_step(o, wk, gk, state, rate)


def _check(heap: Heap, grid, args) -> None:
    w, s1, s2, stride, count, models, half, bad = args
    stride, count, models, half = _v(stride), _v(count), _v(models), _v(half)
    flags = heap.view(_v(bad), np.uint32, models)
    with np.errstate(invalid="ignore"):
        for k in range(models):
            wk = heap.view(_v(w) + 4 * k * stride, np.float32, count)
            if not (np.abs(wk) <= (65504.0 if half else np.finfo(np.float32).max)).all():
                flags[k] |= 1
            for ptr in (_v(s1), _v(s2)):
                if ptr and not np.isfinite(heap.view(ptr + 4 * k * stride, np.float32, count)).all():
                    flags[k] |= 2
            if _v(s2) and (heap.view(_v(s2) + 4 * k * stride, np.float32, count) < 0).any():
                flags[k] |= 4


KERNELS = {
    "many_gather_u8": _gather(np.uint8), "many_gather_f32": _gather(np.float32),
    "many_forward_none": _forward(None), "many_forward_relu": _forward("relu"), "many_forward_gelu": _forward("gelu"),
    "many_xent": _xent, "many_mse": _mse, "many_wgrad": _wgrad, "many_dgrad_relu": _dgrad("relu"),
    "many_dgrad_gelu": _dgrad("gelu"), "many_update": _update, "many_check": _check,
}  # fmt: skip

assert ctypes  # the arguments are ctypes values (fastnn.cuda.driver's arg_*): read with .value / struct fields
