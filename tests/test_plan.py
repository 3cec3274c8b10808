"""The GPU engine's plan arithmetic, checked on the CPU (no GPU needed)."""

import numpy as np
import pytest

from fastnn import MLP
from fastnn._errors import ConfigError
from fastnn._model import init_parameters
from fastnn.engine.plan import ALIGN, gelu_aux_ld, param_layout, precision_spec, relu_aux_ld


def test_layout_offsets_are_aligned_and_disjoint():
    model = MLP([37, 100, 3, 2])
    lay = param_layout(model)
    assert lay.names == ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")
    ends = 0
    for off, shape in zip(lay.offsets, lay.shapes):
        assert off % ALIGN == 0 and off >= ends
        ends = off + int(np.prod(shape))
    assert lay.total % ALIGN == 0 and lay.total >= ends


@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_sharded_layout_splits_every_layer_into_equal_aligned_parts(shards):
    """A sharded update's parts: equal counts (NCCL's reduce-scatter and all-gather), ALIGN-aligned, covering each
    layer's range exactly once and holding its weight and bias; one shard is the plain layout."""
    model = MLP([37, 100, 3, 2])
    lay, plain = param_layout(model, shards), param_layout(model)
    assert lay.names == plain.names and lay.shapes == plain.shapes and lay.shards == shards
    if shards == 1:
        assert lay == plain
    covered = np.zeros(lay.total, dtype=int)
    for layer in range(len(model.layers)):
        start, stop = lay.layer_range(layer)
        w_off, w_shape = lay.slot(lay.names[2 * layer])
        b_off, b_shape = lay.slot(lay.names[2 * layer + 1])
        assert start == w_off and b_off + b_shape[0] <= stop
        parts = [lay.shard(layer, rank) for rank in range(shards)]
        assert len({count for _, count in parts}) == 1
        for first, count in parts:
            assert first % ALIGN == 0 and count % ALIGN == 0 and count > 0
            covered[first : first + count] += 1
        assert parts[0][0] == start and parts[-1][0] + parts[-1][1] == stop
    assert (covered == 1).all()  # the layers' ranges tile the buffer


def test_pack_unpack_round_trip():
    model = MLP([37, 100, 10])
    params = init_parameters(model, seed=3)
    lay = param_layout(model)
    flat = lay.pack(params, np.float32)
    back = lay.unpack(flat)
    for name, a in params.items():
        np.testing.assert_array_equal(back[name], a)
    padding = np.ones(lay.total, dtype=bool)
    for off, shape in zip(lay.offsets, lay.shapes):
        padding[off : off + int(np.prod(shape))] = False
    assert not flat[padding].any()


def test_pack_rejects_wrong_shape():
    model = MLP([4, 3])
    params = init_parameters(model, seed=0)
    params["0.weight"] = params["0.weight"].T
    with pytest.raises(ConfigError, match="0.weight"):
        param_layout(model).pack(params, np.float32)


def test_precision_specs_name_existing_kernels():
    import re
    from pathlib import Path

    native = Path(__file__).resolve().parents[1] / "native"
    sources = "".join(p.read_text() for p in native.glob("*.cu"))
    defined = set(re.findall(r"^(?:UPDATE|XENT|MSE|GATHER|UPDATE_GATHER)\((\w+),", sources, re.M))
    for name in ("mixed", "fp16", "fp32"):
        spec = precision_spec(name)
        assert spec.update_kernel in defined
        assert spec.loss_kernel in defined
        assert spec.mse_kernel in defined
        for src in ("u8", "f32"):
            assert f"gather_{src}_{spec.gather_kernel_suffix}" in defined
            assert spec.update_gather_kernel(src) in defined
    with pytest.raises(ConfigError, match="precision"):
        precision_spec("bf16")


def test_aux_leading_dimensions():
    assert relu_aux_ld(10) == 128 and relu_aux_ld(128) == 128 and relu_aux_ld(129) == 256
    assert gelu_aux_ld(37) == 40 and gelu_aux_ld(8) == 8


@pytest.mark.parametrize("shards", [1, 2])
def test_tensor_runs_cut_a_range_at_the_tensors(shards):
    """What the graph engine's update launches one by one where the biases decay otherwise (bias_decay): each
    tensor with its padding, flagged as a bias or not; a sharded part cut the same way, nothing lost."""
    layout = param_layout(MLP([7, 5, 3]), shards=shards)
    ends = (*layout.offsets[1:], layout.total)
    runs = layout.tensor_runs(0, layout.total)
    assert [(a, c) for a, c, _ in runs] == [(lo, hi - lo) for lo, hi in zip(layout.offsets, ends)]
    assert [bias for *_, bias in runs] == [False, True, False, True]
    for layer in range(2):
        for rank in range(shards):
            first, count = layout.shard(layer, rank)
            part = layout.tensor_runs(first, count)
            assert part[0][0] == first and sum(c for _, c, _ in part) == count
