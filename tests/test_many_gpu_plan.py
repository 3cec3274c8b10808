"""The many-model GPU engine's plan on the CPU: layout, tables, rows of each step and optimizer records against the
NumPy definitions; native/many.cu's Step record against the C struct and every launched kernel in the compiled
module (NVRTC). The engine itself is compared with the NumPy engine in tests/test_many_engines.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fastnn import MLP, SGD, AdamW
from fastnn._shuffle import feistel_bits
from fastnn.engine.base import batch_slices, steps_per_epoch
from fastnn.engine.many.gpu import layout
from fastnn.engine.many.plan import mask_groups, streams


def test_model_layout_is_tensor_major():
    model = MLP([5, 3, 2])
    lay = layout.model_layout(model, 3)
    assert lay.names == ("0.weight", "0.bias", "2.weight", "2.bias") and lay.sizes == (15, 3, 6, 2)
    assert lay.starts == (0, 64, 128, 192, 256)  # each block of 3 models rounded up to 64 floats (256 bytes)
    assert lay.at("0.weight", 2) == 30 and lay.at("2.bias", 1) == 194
    rng = np.random.default_rng(0)
    states = [{n: rng.normal(size=s).astype(np.float32) for n, s in zip(lay.names, lay.shapes)} for _ in range(3)]
    packed = lay.pack(states)
    assert packed.shape == (256,)
    # layer 0's weights of all models are one (K * out, in) matrix, model k's rows k * out ..
    np.testing.assert_array_equal(packed[:45].reshape(9, 5)[3:6], states[1]["0.weight"])
    for k in range(3):
        got = lay.unpack(packed, k)
        for n in lay.names:
            np.testing.assert_array_equal(got[n], states[k][n])
    assert (packed[45:64] == 0).all()  # padding stays zero


@pytest.mark.parametrize("n, batch, drop_last", [(10, 4, False), (10, 4, True), (8, 4, True), (3, 5, False)])
def test_rows_of_each_step_are_the_numpy_engines_batches(n, batch, drop_last):
    steps = steps_per_epoch(n, batch, drop_last)
    got = [layout.rows_at(n, s, batch, drop_last) for s in range(steps + 2)]
    assert got == [hi - lo for lo, hi in batch_slices(n, batch, drop_last)] + [0, 0]
    for first in range(steps + 3):
        assert layout.samples(n, first, batch, drop_last) == sum(got[:first])


def test_group_and_stream_tables():
    masks = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 0, 1]], dtype=bool)
    group, rows = mask_groups(masks, 3)
    per_model = [rows[g] for g in group]
    g2, groups = layout.row_groups(per_model, 3, 4)
    assert g2.tolist() == [0, 1, 0]
    t = layout.group_tables(groups)
    assert t.rows.tolist() == [0, 1, 3, 1, 2, 3] and t.offsets.tolist() == [0, 3] and t.n.tolist() == [3, 3]
    assert t.half.tolist() == [feistel_bits(3) // 2] * 2
    st = layout.stream_tables(streams(g2, np.array([0, 0, 2**32 + 1]), np.ones(3, bool)), t, 2, False)
    assert st.model_stream.tolist() == [0, 1, 2] and st.stream_group.tolist() == [0, 1, 0]
    assert st.stream_epoch.tolist() == [0, 0, 1] and st.steps == 2  # the epoch's low 32 bits key the shuffle
    same, whole = layout.row_groups(None, 2, 5)
    assert same.tolist() == [0, 0] and whole[0].tolist() == [0, 1, 2, 3, 4]
    # equal rows in different arrays are one group too
    assert layout.row_groups([np.arange(3), np.arange(3)], 2, 3)[0].tolist() == [0, 0]


def test_lr_rows_and_its_refusals():
    table = layout.lr_rows([np.full(2, 0.5, np.float32), None, np.full(3, 0.1, np.float32)],
                           np.array([True, False, True]), 3)  # fmt: skip
    np.testing.assert_array_equal(table, np.array([[0.5, 0.5, 0], [0, 0, 0], [0.1, 0.1, 0.1]], np.float32))
    with pytest.raises(ValueError, match="model 1 is active"):
        layout.lr_rows([None, None], np.array([False, True]), 3)


@pytest.mark.bindings  # fastnn.cuda.driver imports cuda.bindings: skipped on a CPU-only install, as CI's is
def test_optim_records_are_optim_cuh_structs():
    recs = layout.optim_records((SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
                                 SGD(lr=0.2, weight_decay=0.01, bias_decay=0.0)))  # fmt: skip
    assert recs.itemsize == 32 and recs.dtype.names == ("kind", "momentum", "weight_decay", "nesterov", "beta1",
                                                          "beta2", "eps", "bias_decay")  # fmt: skip
    assert recs[0]["nesterov"] == 1 and recs[0]["momentum"] == np.float32(0.9) and recs[1]["momentum"] == 0
    assert recs[0]["bias_decay"] == np.float32(0.01) and recs[1]["bias_decay"] == 0  # None: the weights' decay
    from fastnn.cuda.driver import arg_struct  # the ctypes struct the single-model kernels get: the same bytes

    one = arg_struct(SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True).kernel_params().c_fields())
    assert bytes(one) == recs[:1].tobytes()
    adam = layout.optim_records((AdamW(betas=(0.8, 0.99), eps=1e-6),))
    assert adam[0]["kind"] == 1 and adam[0]["beta1"] == np.float32(0.8) and adam[0]["eps"] == np.float32(1e-6)


# ---- native/many.cu itself (NVRTC, no GPU) ------------------------------------------------------------------


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_launched_kernel_is_in_the_module(arch):
    nvrtc = pytest.importorskip("fastnn.cuda.nvrtc", reason="needs the CUDA wheels")
    from fastnn.engine.many.gpu import kernels

    cubin = nvrtc.compile_native("many.cu", arch)
    for name in kernels.KERNELS:
        assert name.encode() + b"\0" in cubin, name


@pytest.mark.bindings
def test_step_record_matches_the_c_struct():
    nvrtc = pytest.importorskip("fastnn.cuda.nvrtc", reason="needs the CUDA wheels")
    from fastnn.engine.many.gpu import kernels
    from fastnn.engine.many.gpu.kernels import STEP_FIELDS

    arg = kernels.step_arg(kernels.StepTables(*([1] * 2), False, 1.0, 0.0, *([0] * 9), 1), 3, 128, True, False)
    source = (nvrtc.native_dir() / "many.cu").read_text()
    c_types = {"u64": "u64", "i32": "int"}
    values = ", ".join(str(i + 1) for i in range(len(STEP_FIELDS)))
    lines = [source, "template <typename A, typename B> struct same { static const bool value = false; };",
             "template <typename A> struct same<A, A> { static const bool value = true; };",
             f'static_assert(sizeof(Step) == {ctypes.sizeof(arg)}, "size");', f"constexpr Step probe{{{values}}};"]
    for i, (name, kind) in enumerate(STEP_FIELDS):
        assert getattr(type(arg), name).offset == ctypes.sizeof(arg) - sum(  # ctypes packs them in this order
            ctypes.sizeof(t) for n, t in type(arg)._fields_[i:])
        lines.append(f'static_assert(probe.{name} == {i + 1}, "{name} position");')
        lines.append(f'static_assert(same<decltype(Step::{name}), {c_types[kind]}>::value, "{name} type");')
    probe = "\n".join(lines)
    nvrtc.compile_source(probe, "step_probe.cu", "sm_90", (), include_dirs=(nvrtc.native_dir(),))


def test_xent_tile_takes_about_k_over_sms_models_a_block():
    from fastnn.engine.many.gpu.layout import XENT_TILE_FLOATS, xent_tile  # CUDA-free: the CPU-only install runs it

    assert [xent_tile(k, 10, 132) for k in (1, 32, 128, 131, 264, 1024, 65_535)] == [1, 1, 1, 1, 2, 4, 4]
    assert xent_tile(1024, 2000, 132) == 2  # a tile's row in the shared tile
    assert xent_tile(1024, XENT_TILE_FLOATS, 132) == 1 and xent_tile(8, XENT_TILE_FLOATS + 1, 132) == 0


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("field, variants, names", [
    ("many_loss_kernel", "MANY_LOSS_KERNELS", "LOSS_KERNELS"),
    ("many_update_kernel", "MANY_UPDATE_KERNELS", "UPDATE_KERNELS"),
])  # fmt: skip
def test_every_kernel_variant_is_in_the_module(arch, field, variants, names):
    """Each value of the Tuning field names a kernel of native/many.cu (NVRTC for the architecture), and the engine
    looks it up when built (kernels.KERNELS)."""
    nvrtc = pytest.importorskip("fastnn.cuda.nvrtc", reason="needs the CUDA wheels")
    from fastnn.engine import tuning
    from fastnn.engine.many.gpu import kernels

    table = getattr(kernels, names)
    assert tuple(table) == getattr(tuning, variants) and getattr(tuning.Tuning(), field) in table
    cubin = nvrtc.compile_native("many.cu", arch)
    for name in table.values():
        assert name in kernels.KERNELS and name.encode() + b"\0" in cubin, name


@pytest.mark.bindings
def test_tiled_loss_constants_match_the_kernel():
    """kernels.py's LOSS_THREADS, XENT_TILE_MODELS and XENT_TILE_FLOATS are native/many.cu's (static_assert)."""
    nvrtc = pytest.importorskip("fastnn.cuda.nvrtc", reason="needs the CUDA wheels")
    from fastnn.engine.many.gpu import kernels

    source = (nvrtc.native_dir() / "many.cu").read_text()
    probe = "\n".join([source] + [f'static_assert({c} == {v}, "{c}");' for c, v in (
        ("LOSS_SLOTS", kernels.LOSS_THREADS), ("XENT_TILE_MODELS", kernels.XENT_TILE_MODELS),
        ("XENT_TILE_FLOATS", kernels.XENT_TILE_FLOATS))])  # fmt: skip
    nvrtc.compile_source(probe, "tile_probe.cu", "sm_90", (), include_dirs=(nvrtc.native_dir(),))
    with pytest.raises(Exception, match="XENT_TILE_MODELS"):  # the probe can fail
        nvrtc.compile_source(source + '\nstatic_assert(XENT_TILE_MODELS == 5, "XENT_TILE_MODELS");', "tile_probe.cu",
                             "sm_90", (), include_dirs=(nvrtc.native_dir(),))  # fmt: skip
