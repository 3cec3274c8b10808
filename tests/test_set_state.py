"""GraphEngine.set_state on the CPU, its device memory a host byte array: the bytes it leaves are the flat layout
(parameters and optimizer state packed, padding zero, the state not given kept), written without a flat host copy."""

from __future__ import annotations

import numpy as np
import pytest

from fastnn import MLP, AdamW, ConfigError
from fastnn._loss import describe
from fastnn._model import init_parameters
from fastnn.engine.base import EngineConfig
from fastnn.engine.plan import param_layout, precision_spec

pytestmark = pytest.mark.bindings  # imports the graph engine (cuda-bindings); no GPU needed
graph = pytest.importorskip("fastnn.engine.graph.engine", reason="needs the CUDA wheels")
from fastnn.engine.graph.resources import Resources  # noqa: E402


class _HostBuffer:
    """A DeviceBuffer's upload, download and memset on host bytes, poisoned (0xAB) like fresh device memory."""

    def __init__(self, nbytes: int) -> None:
        self.bytes = np.full(nbytes, 0xAB, dtype=np.uint8)
        self.ptr = 1 << 20
        self.uploaded: list[np.ndarray] = []
        self.downloads = 0

    def memset(self, byte: int, stream=None) -> None:
        self.bytes[:] = byte

    def upload(self, array: np.ndarray, stream=None, offset: int = 0) -> None:
        assert array.flags.c_contiguous and offset % 256 == 0  # tensors sit at ALIGN-aligned offsets
        self.uploaded.append(array)
        self.bytes[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)

    def download(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
        self.downloads += 1
        out.reshape(-1).view(np.uint8)[:] = self.bytes[offset : offset + out.nbytes]
        return out


class _Nothing:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _engine(monkeypatch, precision: str):
    model = MLP([5, 130, 3])  # 650 + 130 + 390 + 3 elements, each tensor padded to 128
    cfg = EngineConfig(model=model, optimizer=AdamW(lr=1e-3), batch_size=4, precision=precision)
    eng = object.__new__(graph.GraphEngine)
    eng.resources = Resources(cfg, precision_spec(precision), param_layout(model), describe(cfg.loss), 1, None, False,
                              _Nothing())
    eng.config = cfg
    eng.opt_names = cfg.optimizer.state_names
    eng.param_bytes = -(-eng.layout.total * eng.spec.param().itemsize // 256) * 256
    eng.opt_bytes = -(-eng.layout.total * 4 // 256) * 256
    eng.state_bytes = eng.param_bytes + len(eng.opt_names) * eng.opt_bytes
    eng.train_state, eng.w16, eng._state_set = _HostBuffer(eng.state_bytes), None, False
    eng.dev = eng.stream = _Nothing()

    def memset_d32(ptr: int, value: int, count: int, stream) -> None:
        start = ptr - eng.train_state.ptr
        eng.train_state.bytes[start : start + 4 * count].view(np.uint32)[:] = value

    monkeypatch.setattr(graph.driver, "memset_d32", memset_d32)
    return eng


def _expected(eng, before: np.ndarray, state: dict) -> np.ndarray:
    """What set_state wrote before issue 26: the bytes kept (zero before the first call), each region given packed."""
    raw = before.copy()
    params = eng.layout.pack(state, eng.spec.param).view(np.uint8)
    raw[: params.size] = params
    for i, name in enumerate(eng.opt_names):
        prefix = f"opt.{name}."
        if all(prefix + n in state for n in eng.layout.names):
            flat = eng.layout.pack({n: state[prefix + n] for n in eng.layout.names}, np.float32).view(np.uint8)
            start = eng.param_bytes + i * eng.opt_bytes
            raw[start : start + flat.size] = flat
    return raw


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_set_state_writes_the_packed_layout_and_keeps_what_it_is_not_given(monkeypatch, precision):
    eng = _engine(monkeypatch, precision)
    buf = eng.train_state
    params = init_parameters(eng.config.model, 3)
    eng.set_state(params)  # as the engine's constructor does: the optimizer state starts at zero
    assert np.array_equal(buf.bytes, _expected(eng, np.zeros_like(buf.bytes), params))
    assert buf.downloads == 0
    if precision == "fp32":  # the caller's own arrays go to the device: no flat copy of the state on the host
        assert len(buf.uploaded) == 4 and all(any(u is p for p in params.values()) for u in buf.uploaded)

    rng = np.random.default_rng(0)
    full = {n: rng.normal(size=a.shape) for n, a in params.items()}  # float64: cast as pack casts
    full.update({f"opt.{s}.{n}": rng.uniform(0, 1, a.shape).astype(np.float32) for s in eng.opt_names
                 for n, a in params.items()})  # fmt: skip
    before = buf.bytes.copy()
    eng.set_state(full)
    assert np.array_equal(buf.bytes, _expected(eng, before, full))

    buf.bytes[eng.layout.offsets[1] * eng.spec.param().itemsize - 4 :][:4] = 0xCD  # garbage in the padding...
    buf.bytes[-8:] = 0xEE  # ...and past the last region's tensors (its rounding to 256 bytes)
    before = buf.bytes.copy()
    eng.set_state(params)  # parameters only: the optimizer state stays, the parameters' padding is zero again
    after = _expected(eng, before, params)
    assert np.array_equal(buf.bytes, after) and (after[-8:] == 0xEE).all()
    assert buf.downloads == 0

    bad = dict(full)
    bad[f"opt.{eng.opt_names[-1]}.2.bias"] = np.zeros(4, np.float32)
    with pytest.raises(ConfigError, match=r"2\.bias.*has shape \(4,\)"):
        eng.set_state(bad)
    assert np.array_equal(buf.bytes, after)  # refused before a byte was written
