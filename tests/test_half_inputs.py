"""Inputs beyond float16's range under precision "mixed"/"fp16": refused by name, after
`normalize`, in fit, evaluate, predict and predict_proba, on every device; precision "fp32" takes them.

On the GPU a feature of 7e4 became inf in the gather's float16 output and every prediction of its row NaN,
with no error. The CPU tests hold the rule on the NumPy engine (which computes in float32 whatever the
precision: the same call must give the same answer everywhere); the GPU ones run it on the engine matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fastnn import MLP, SGD, DataError, Trainer
from fastnn._data import check_operand_range

D, C, N = 6, 3, 64
ROW, COL, BIG = 7, 2, 7e4


def _data(big: float | None = BIG) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype(np.float32)
    if big is not None:
        x[ROW, COL] = big
    return x, rng.integers(0, C, N)


def _calls(t: Trainer, x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], object]]:
    ok_x, ok_y = _data(None)
    return {
        "fit": lambda: t.fit(x, y, epochs=1, progress=False),
        "fit eval_data": lambda: t.fit(ok_x, ok_y, epochs=1, eval_data=(x, y), progress=False),
        "fit validation_split": lambda: t.fit(x, y, epochs=1, validation_split=0.25, progress=False),
        "evaluate": lambda: t.evaluate(x, y),
        "predict": lambda: t.predict(x),
        "predict_proba": lambda: t.predict_proba(x),
    }


def _assert_refused(call: Callable[[], object], name: str, value: str, row: int = ROW, col: int = COL) -> str:
    with pytest.raises(DataError) as info:
        call()
    msg = str(info.value)
    for w in (f"{name} holds {value}", f"row {row}, column {col}", "65504", "normalize=", "precision='fp32'"):
        assert w in msg, f"{w!r} not in: {msg}"
    return msg


@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_a_feature_beyond_float16_is_refused_by_name_on_the_cpu(precision: str) -> None:
    x, y = _data()
    t = Trainer(MLP([D, 8, C]), SGD(lr=0.1), batch_size=16, precision=precision, device="cpu")
    before = {k: v.copy() for k, v in t.state_dict().items()}
    for what, call in _calls(t, x, y).items():
        name = "eval_data[0]" if what == "fit eval_data" else "x"
        if what == "fit eval_data":
            t2 = Trainer(MLP([D, 8, C]), SGD(lr=0.1), batch_size=16, precision=precision, device="cpu")
            call = _calls(t2, x, y)[what]
        assert f"precision={precision!r}" in _assert_refused(call, name, "70000.0"), what
    assert (t.epoch, t.step, len(t.history)) == (0, 0, 0)  # refused before any work
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    f32 = Trainer(MLP([D, 8, C]), SGD(lr=0.01), batch_size=16, precision="fp32", device="cpu")
    for call in _calls(f32, x, y).values():  # precision "fp32" takes the same inputs
        call()
    assert np.isfinite(f32.predict_proba(x)).all()


def test_the_limit_is_float16s_largest_value_after_rounding() -> None:
    # 65504 is float16's largest value; float16 rounds up to 65519.99 down to it, 65520 and beyond to inf.
    t = Trainer(MLP([D, C]), device="cpu")
    t.load_state_dict(t.state_dict())  # its initial weights, given: predict answers
    for fine in (65504.0, -65504.0, 65519.0):
        x, _ = _data(fine)
        t.predict(x)
    for beyond in (65520.0, -65520.0, 3e38):
        x, _ = _data(beyond)
        _assert_refused(lambda x=x: t.predict(x), "x", repr(float(np.float32(beyond))))


def test_inputs_are_checked_after_normalize() -> None:
    x, y = _data()
    t = Trainer(MLP([D, 8, C]), batch_size=16, device="cpu", normalize=(0.0, 10.0))  # 7e4 -> 7e3: accepted
    t.fit(x, y, epochs=1, progress=False)
    assert np.isfinite(t.predict_proba(x)).all()
    per_feature = Trainer(MLP([D, C]), device="cpu", normalize=(0.0, [1, 1, 2, 1, 1, 1]))  # only column 2 scaled
    per_feature.load_state_dict(per_feature.state_dict())  # its initial weights, given: predict answers
    per_feature.predict(x)
    x, _ = _data(500.0)
    t = Trainer(MLP([D, C]), device="cpu", normalize=(0.0, 1e-2))  # 500 -> 5e4 is fine, 700 -> 7e4 is not
    t.load_state_dict(t.state_dict())
    t.predict(x)
    x[ROW + 3, COL + 1] = 700.0
    msg = _assert_refused(lambda: t.predict(x), "x", "700.0", ROW + 3, COL + 1)
    assert "which the network sees as 70000" in msg, msg
    per_feature = Trainer(MLP([D, C]), device="cpu", normalize=(0.0, [1, 1, 1, 1e-2, 1, 1]))
    _assert_refused(lambda: per_feature.predict(x), "x", "700.0", ROW + 3, COL + 1)


def test_uint8_inputs_are_checked_after_normalize() -> None:
    x = np.full((N, D), 255, np.uint8)
    t = Trainer(MLP([D, C]), device="cpu")
    t.load_state_dict(t.state_dict())
    t.predict(x)  # 255 / 255 = 1
    t = Trainer(MLP([D, C]), device="cpu", normalize=(0.0, 1e-5))  # 1 / 1e-5 = 1e5
    msg = _assert_refused(lambda: t.predict(x), "x", "255", 0, 0)
    assert "which the network sees as 100000" in msg, msg


def test_the_first_offending_entry_is_named_in_row_major_order() -> None:
    x, _ = _data(None)
    x[40, 1], x[9, 5], x[9, 3] = 1e5, -2e5, 8e4
    with pytest.raises(DataError, match=r"x holds 80000.0 in row 9, column 3"):
        check_operand_range(x, None, np.float16, "x", "precision='mixed'")
    check_operand_range(x, None, np.float32, "x", "precision='fp32'")  # float32 operands: nothing to check


# ---- the GPU engines ------------------------------------------------------------------------------------------


def _gpu(engine: dict, precision: str) -> Trainer:
    from test_gpu_engines import _refused

    model, opt = MLP([D, 8, C]), SGD(lr=0.1)
    if _refused(engine, model, opt, 16, precision):
        pytest.skip("the fused engine refuses this case (checked to be allowed)")
    return Trainer(model, opt, batch_size=16, precision=precision, device="cuda", **engine)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_a_feature_beyond_float16_is_refused_by_name_on_the_gpu(engine: dict, precision: str) -> None:
    # The reproducer: one feature of 7e4 gave NaN probabilities and class 0 from predict, no error.
    x, y = _data()
    ok_x, ok_y = _data(None)
    with _gpu(engine, precision) as t:
        for what, call in _calls(t, x, y).items():
            if what == "fit eval_data":
                continue  # below, on a trainer that has trained nothing yet
            _assert_refused(call, "x", "70000.0")
        assert (t.epoch, t.step, len(t.history)) == (0, 0, 0)
        _assert_refused(lambda: t.fit(ok_x, ok_y, eval_data=(x, y), progress=False), "eval_data[0]", "70000.0")
        t.fit(ok_x, ok_y, epochs=1, progress=False)  # the trainer is still usable
        assert np.isfinite(t.predict_proba(ok_x)).all()
    # precision "fp32" on the GPU takes the same inputs and predicts them as the CPU does
    cpu = Trainer(MLP([D, 8, C]), SGD(lr=0.1), batch_size=16, precision="fp32", device="cpu")
    with _gpu(engine, "fp32") as t:
        t.fit(ok_x, ok_y, epochs=2, progress=False)
        cpu.fit(ok_x, ok_y, epochs=2, progress=False)
        p, p_cpu = t.predict_proba(x), cpu.predict_proba(x)
        assert np.isfinite(p).all()
        assert p[ROW].argmax() == p_cpu[ROW].argmax()  # its logits are ~1e4: compared by class, not probability
        others = np.arange(N) != ROW
        np.testing.assert_allclose(p[others], p_cpu[others], rtol=1e-3, atol=1e-5)
        assert np.isfinite(t.evaluate(x, y)["loss"])
