"""fastnn._model.init_parameters: the one initialisation every engine, checkpoint and comparison starts from."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from fastnn import MLP
from fastnn._model import init_parameters, param_names

# sha256 of (name, dtype, shape, bytes) of every tensor, in order, as the init drew them before it drew in pieces
# (issue 26): a change of any bit of any engine's starting point fails here. [300, 257, 3]'s first weight has
# 77,100 elements, more than one piece (model._INIT_CHUNK = 65,536).
PINNED = {
    ((300, 257, 3), 0): "1a385866f4fbe5624f9d698249b8ed997a969cb0426d920fb3220ca8bbbf0057",
    ((784, 16, 16, 10), 2**64 - 1): "93e26c1f8bfccae6cbffa5811cfbb7b3d10d6e5dcfb243246c804264c7e78f63",
    ((2, 2), 7): "df890183942c24724d963788ebc0bb26e677ce663ce6b04b80bc7ed4136d8696",
}


def _digest(params: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name, value in params.items():
        h.update(name.encode())
        h.update(value.dtype.str.encode())
        h.update(str(value.shape).encode())
        h.update(value.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(("sizes", "seed"), list(PINNED))
def test_init_is_bit_for_bit_what_it_always_was(sizes, seed):
    params = init_parameters(MLP(sizes), seed)
    assert list(params) == param_names(MLP(sizes))
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in params.values())
    assert _digest(params) == PINNED[sizes, seed]


def test_init_values_of_a_small_model():
    """A few values written out, so the definition (torch's nn.Linear bounds, PCG64, layer by layer, weight then
    bias) can be checked by eye."""
    p = init_parameters(MLP([300, 257, 3]), 0)
    assert float(p["0.weight"][0, 0]).hex() == "0x1.031cce0000000p-6"
    assert float(p["0.weight"][-1, -1]).hex() == "-0x1.b482e20000000p-6"
    assert float(p["0.bias"][0]).hex() == "-0x1.b1ec800000000p-5"
    assert np.abs(p["0.weight"]).max() <= 1 / math.sqrt(300) and np.abs(p["2.weight"]).max() <= 1 / math.sqrt(257)


def test_init_in_pieces_equals_one_draw_of_the_whole_tensor():
    """Drawing in pieces is drawing the same doubles in the same order: uniform(size=n) then astype, as before."""
    from fastnn import _model as model

    rng = np.random.Generator(np.random.PCG64(11))
    whole = rng.uniform(-0.5, 0.5, size=3 * model._INIT_CHUNK + 5).astype(np.float32)
    rng = np.random.Generator(np.random.PCG64(11))
    pieces = model._uniform_f32(rng, 0.5, (3, model._INIT_CHUNK + 1, 1))
    assert pieces.shape == (3, model._INIT_CHUNK + 1, 1)
    np.testing.assert_array_equal(pieces.reshape(-1).view(np.uint32), whole[: pieces.size].view(np.uint32))
