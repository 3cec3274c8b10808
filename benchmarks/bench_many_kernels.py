"""The many-model GPU engine's loss and update kernels alone (native/many.cu), each variant against the default:
the same bits, then the time of each, at the benchmark's shapes (docs/design/many-models.md, "Next kernels").

    PYTHONPATH=$PWD python benchmarks/bench_many_kernels.py [--repeats 200]
    PYTHONPATH=$PWD python benchmarks/bench_many_kernels.py --dry-run   # the shapes and launches, no GPU

Loss: many_xent (a block a model) and many_xent_tiled (a block a tile of models) on random logits (batch, K, 10) with
labels, each model's rows at step 0 of its stream: every model the full batch, or (`folds`) alternate models a
shorter batch, so the models of a tile have different rows. Their dz (poisoned with NaN first: the positions neither
writes must stay poison in both) and per-model sums are compared byte for byte, the sums also against NumPy in
float64. Update: many_update and many_update_vec on the same state (SGD with L2, momentum on every other model, as
MultiTrainer's per-model optimizers), one launch each from the same bytes, compared byte for byte. Then each is
timed as the engine runs it: `repeats` copies in one CUDA graph (fastnn.cuda.driver.time_captured), the mean a
launch. The expected times are the design page's budget; nothing here was measured when it was written.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from fastnn import MLP, SGD  # noqa: E402
from fastnn.engine.many.gpu import kernels, layout  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """One row of the sweep: K models of `sizes` at `batch` rows; `folds`: alternate models a shorter batch."""

    name: str
    sizes: tuple[int, ...]
    models: int
    batch: int
    folds: bool = False


SHAPES = [Shape("logreg", (784, 10), k, 128) for k in (1, 32, 128, 1024)] + [
    Shape("logreg folds", (784, 10), 1024, 128, folds=True),
    Shape("mlp-128", (784, 128, 128, 128, 10), 128, 32),
]
SHORT = 37  #: rows fewer in the second stream (`folds`)


def xent_reference(z: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(K, 2): each model's loss sum and correct count over its rows, float64 (the NumPy engine's definition)."""
    out = np.zeros((z.shape[1], 2))
    for k in range(z.shape[1]):
        zk = z[: rows[k], k].astype(np.float64)
        m = zk.max(axis=1, keepdims=True)
        logp = zk - m - np.log(np.exp(zk - m).sum(axis=1, keepdims=True))
        y = labels[k][: rows[k]]
        out[k] = [-logp[np.arange(rows[k]), y].sum(), (zk.argmax(axis=1) == y).sum()]
    return out


def tables(shape: Shape) -> dict[str, np.ndarray]:
    """The Step record's tables: one stream of `batch` rows, or (folds) two, alternate models reading the second."""
    streams = 2 if shape.folds else 1
    return {
        "model_stream": (np.arange(shape.models) % streams).astype(np.int32),
        "stream_group": np.arange(streams, dtype=np.int32),
        "stream_epoch": np.zeros(streams, dtype=np.uint32),
        "group_n": np.array([shape.batch, shape.batch - SHORT][:streams], dtype=np.uint32),
        "group_half": np.zeros(streams, dtype=np.uint32),
    }


def update_grid(sizes: tuple[int, ...], models: int, sm_count: int) -> tuple[int, int, int]:
    """kernels.per_model_grid's grid for these tensor sizes."""
    want = -(-max(sizes) // (4 * kernels.ELEMENTWISE_THREADS))
    return (max(1, min(want, -(-sm_count * 8 // models))), models, 1)


def measure(shape: Shape, repeats: int, driver: Any = None, cubin: bytes | None = None) -> dict[str, float]:
    """Check each variant against the default (and the loss against NumPy), then time all four (us a launch).
    driver, cubin: fastnn.cuda.driver and native/many.cu compiled for the device (None), or stand-ins (the CPU test
    runs the launches through tests/_many_emulator.py)."""
    from fastnn.cuda.driver import arg_i32, arg_ptr, arg_u32

    if driver is None:
        from fastnn.cuda import driver
    dev = driver.get_device(0)
    dev.make_current()
    rng = np.random.default_rng(0)
    k, c, b = shape.models, shape.sizes[-1], shape.batch
    tab = tables(shape)
    rows = tab["group_n"][tab["model_stream"]].astype(np.int64)
    z = (3 * rng.normal(size=(b, k, c))).astype(np.float32)
    yb = rng.integers(0, c, size=(len(tab["group_n"]), b)).astype(np.uint32)
    model = MLP(list(shape.sizes))
    lay = layout.model_layout(model, k)
    opts = tuple(SGD(lr=0.01, momentum=0.9 if j % 2 else 0.0, weight_decay=1e-4) for j in range(k))
    recs = layout.optim_records(opts)
    w = rng.normal(size=lay.total).astype(np.float32)
    g = rng.normal(size=lay.total).astype(np.float32)
    s1 = rng.normal(size=lay.total).astype(np.float32)
    bufs: list[driver.DeviceBuffer] = []

    def buf(array: np.ndarray) -> driver.DeviceBuffer:
        out = driver.DeviceBuffer(max(array.nbytes, 256))
        out.upload(np.ascontiguousarray(array))
        bufs.append(out)
        return out

    if cubin is None:
        from fastnn.cuda import nvrtc

        cubin = nvrtc.compile_native("many.cu", dev.arch)
    stream = driver.Stream(dev)
    mod = driver.Module(cubin)
    try:
        t = {name: buf(v) for name, v in tab.items()}
        st = kernels.step_arg(kernels.StepTables(
            x=0, y=0, x_u8=True, scale=1.0, shift=0.0, fscale=0, fshift=0, rows=0, group_offsets=0,
            group_n=t["group_n"].ptr, group_half=t["group_half"].ptr, model_stream=t["model_stream"].ptr,
            stream_group=t["stream_group"].ptr, stream_epoch=t["stream_epoch"].ptr, streams=len(tab["group_n"])),
            0, b, False, True)  # fmt: skip
        zb, ybb = buf(z), buf(yb)
        dz = {v: buf(np.full(z.size, np.nan, np.float32)) for v in ("model", "tiled")}
        hist = {v: buf(np.zeros(2 * k)) for v in ("model", "tiled")}
        tile = kernels.xent_tile(k, c, dev.sm_count)
        base = [arg_ptr(zb.ptr), arg_ptr(ybb.ptr), arg_i32(c), arg_i32(k)]

        def loss(v: str) -> None:
            out = [arg_ptr(dz[v].ptr), arg_ptr(hist[v].ptr), st]
            if v == "model":
                mod.function("many_xent").launch((k, 1, 1), (kernels.LOSS_THREADS, 1, 1), base + out, stream)
            else:
                mod.function("many_xent_tiled").launch((-(-k // tile), 1, 1), (kernels.LOSS_THREADS, 1, 1),
                                                       base + [arg_i32(tile)] + out, stream)  # fmt: skip

        results = {}
        for v in ("model", "tiled"):
            loss(v)
            stream.synchronize()
            results[v] = (dz[v].download(np.empty(z.size, np.uint32)), hist[v].download(np.empty((k, 2))))
        assert np.array_equal(results["model"][0], results["tiled"][0]), "many_xent_tiled: dz differs from many_xent's"
        assert np.array_equal(results["model"][1], results["tiled"][1]), "many_xent_tiled: sums differ from many_xent's"
        want = xent_reference(z, yb[tab["model_stream"]], rows)
        np.testing.assert_allclose(results["model"][1], want, rtol=1e-5, atol=1e-3, err_msg="many_xent against NumPy")

        state = {v: (buf(w), buf(s1)) for v in ("scalar", "vec4")}
        gb, starts, sizes = buf(g), buf(np.array(lay.starts, np.uint64)), buf(np.array(lay.sizes, np.uint32))
        ob, lr, step0 = buf(recs), buf(np.full(k, 0.01, np.float32)), buf(np.zeros(k, np.uint64))
        grid = update_grid(lay.sizes, k, dev.sm_count)

        def update(v: str) -> None:
            wb, mb = state[v]
            args = [arg_ptr(wb.ptr), arg_ptr(gb.ptr), arg_ptr(mb.ptr), arg_ptr(0), arg_ptr(starts.ptr),
                    arg_ptr(sizes.ptr), arg_i32(len(lay.sizes)), arg_u32(0), arg_ptr(ob.ptr), arg_ptr(lr.ptr),
                    arg_i32(1), arg_ptr(step0.ptr), st]  # fmt: skip
            name = kernels.UPDATE_KERNELS[v]
            mod.function(name).launch(grid, (kernels.ELEMENTWISE_THREADS, 1, 1), args, stream)

        after = {}
        for v in ("scalar", "vec4"):
            update(v)
            stream.synchronize()
            after[v] = [b_.download(np.empty(lay.total, np.uint32)) for b_ in state[v]]
        for name, a, b_ in zip(("weights", "momentum"), after["scalar"], after["vec4"]):
            assert np.array_equal(a, b_), f"many_update_vec: {name} differ from many_update's"

        us = {f"loss {v}": driver.time_captured(stream, lambda v=v: [loss(v) for _ in range(repeats)])
              for v in ("model", "tiled")}  # fmt: skip
        us |= {f"update {v}": driver.time_captured(stream, lambda v=v: [update(v) for _ in range(repeats)])
               for v in ("scalar", "vec4")}  # fmt: skip
    finally:
        for b_ in bufs:
            b_.close()
        mod.close()
        stream.close()
    return {name: ms * 1000.0 / repeats for name, ms in us.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--dry-run", action="store_true", help="print the shapes, tiles and grids (132 SMs); no GPU")
    args = ap.parse_args(argv)
    if args.dry_run:
        for s in SHAPES:
            lay = layout.model_layout(MLP(list(s.sizes)), s.models)
            tile = kernels.xent_tile(s.models, s.sizes[-1], 132)
            print(f"{s.name:13s} K={s.models:5d} batch {s.batch:4d}: loss blocks {s.models} -> "
                  f"{-(-s.models // tile)} of {tile} models; update grid {update_grid(lay.sizes, s.models, 132)}; "
                  f"rows {sorted(set(tables(s)['group_n'].tolist()))}")  # fmt: skip
        return 0
    from fastnn.cuda import driver

    print(f"device: {driver.device_name(0)}; us a launch, mean of {args.repeats} in one graph")
    print(f"{'shape':13s} {'K':>5s} {'loss model':>11s} {'loss tiled':>11s} {'update scalar':>14s} "
          f"{'update vec4':>12s}")
    for s in SHAPES:
        t = measure(s, args.repeats)
        print(f"{s.name:13s} {s.models:5d} {t['loss model']:11.2f} {t['loss tiled']:11.2f} {t['update scalar']:14.2f} "
              f"{t['update vec4']:12.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
