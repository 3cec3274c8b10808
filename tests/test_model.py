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
    pieces = np.empty(3 * (model._INIT_CHUNK + 1), np.float32)
    model._uniform_f32(rng, 0.5, pieces)
    np.testing.assert_array_equal(pieces.view(np.uint32), whole[: pieces.size].view(np.uint32))


def _sequential(seed: int, sizes: list[int], bounds: list[float]) -> list[np.ndarray]:
    """One generator, tensor after tensor: the definition the threaded draw must reproduce."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return [rng.uniform(-b, b, size=n).astype(np.float32) for n, b in zip(sizes, bounds)]


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
def test_threads_draw_the_one_stream_bit_for_bit(workers):
    """Each thread starts at its place in the stream (PCG64.advance): parts that begin inside a piece, inside a
    tensor and at a tensor's first value all give the sequential values."""
    from fastnn import _model as model

    sizes = [model._INIT_CHUNK + 7, 3, 2 * model._INIT_CHUNK - 1, 1, 5000]
    bounds = [0.25, 1.0, 0.125, 0.5, 2.0**-5]
    spans = [(np.full(n, np.nan, np.float32), b) for n, b in zip(sizes, bounds)]
    model._draw(2**64 - 3, spans, workers)
    for (got, _), want in zip(spans, _sequential(2**64 - 3, sizes, bounds)):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_large_model_is_drawn_by_threads_with_the_pinned_values(monkeypatch):
    """init_parameters hands the draw to several threads (here forced to 4 for a small model): the digest pinned
    above is unchanged."""
    import threading

    from fastnn import _model as model

    names = []
    real = model._draw_part

    def spy(*args):
        names.append(threading.current_thread().name)
        real(*args)

    monkeypatch.setattr(model, "_init_workers", lambda count: 4)
    monkeypatch.setattr(model, "_draw_part", spy)
    params = init_parameters(MLP((300, 257, 3)), 0)
    assert _digest(params) == PINNED[(300, 257, 3), 0]
    assert sorted(names) == ["MainThread"] + ["fastnn-init"] * 3


def test_init_workers_follow_the_model_size(monkeypatch):
    from fastnn import _model as model

    monkeypatch.setattr(model.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert model._init_workers(MLP([784, 128, 10]).num_parameters()) == 1  # small: no thread started
    assert model._init_workers(MLP([784, 8192, 8192, 8192, 10]).num_parameters()) == model._INIT_MAX_THREADS
    monkeypatch.setattr(model.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert model._init_workers(MLP([784, 8192, 8192, 8192, 10]).num_parameters()) == 2


def test_a_failing_thread_raises_on_the_caller_and_none_is_left_running(monkeypatch):
    import threading

    from fastnn import _model as model

    def fail(seed, spans, start, stop):
        if start:
            raise MemoryError(f"part at {start}")

    monkeypatch.setattr(model, "_init_workers", lambda count: 3)
    monkeypatch.setattr(model, "_draw_part", fail)
    with pytest.raises(MemoryError, match="part at"):
        init_parameters(MLP((300, 257, 3)), 0)
    assert not [t for t in threading.enumerate() if t.name == "fastnn-init"]
