"""Inputs as people have them: int/bool/pandas features, messages that name the cause, GPU arrays (CPU side)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastnn
from fastnn import MLP, DataError, Trainer
from fastnn._data import check_inputs, check_labels

D, C = 6, 3


def _xy(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 5, size=(n, D)), rng.integers(0, C, size=n)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint16, bool])
def test_int_and_bool_features_train_as_their_float_values(dtype):
    x, y = _xy()
    x = x.astype(dtype)
    a = Trainer(MLP([D, 4, C]), batch_size=8, device="cpu")
    b = Trainer(MLP([D, 4, C]), batch_size=8, device="cpu")
    a.fit(x, y, epochs=2, progress=False)
    b.fit(x.astype(np.float32), y, epochs=2, progress=False)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])


def test_bool_labels_are_0_and_1():
    x, _ = _xy()
    y = np.arange(40) % 2 == 0
    np.testing.assert_array_equal(check_labels(y, 40, 2), y.astype(np.int32))


class _RequiresGrad:
    requires_grad = True

    def __array__(self, *a, **k):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")


class _Sparse:
    nnz = 3
    shape = (40, D)

    def toarray(self):
        return np.zeros(self.shape)


@pytest.mark.parametrize(
    ("x", "words"),
    [
        (_RequiresGrad(), ["x", "requires grad", "x.detach()"]),
        (_Sparse(), ["x", "scipy sparse", "x.toarray()"]),
        ((row for row in np.zeros((40, D))), ["x", "generator", "numpy.asarray(list(x))"]),
        (np.array([[1, None, 3, 4, 5, 6]] * 40, dtype=object), ["x", "row 0, column 1", "missing values"]),
        (np.where(np.eye(40, D, dtype=bool), np.nan, 0.0), ["x", "nan", "row 0, column 0", "missing values"]),
    ],
    ids=["requires-grad", "sparse", "generator", "object-with-None", "nan"],
)
def test_messages_name_the_cause(x, words):
    with pytest.raises(DataError) as info:
        check_inputs(x, D, "x")
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_pandas_frames_and_nullable_dtypes():
    pd = pytest.importorskip("pandas")
    x, y = _xy()
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(D)]).astype("Int64")
    np.testing.assert_array_equal(check_inputs(df, D), x.astype(np.float32))
    df.iloc[3, 2] = pd.NA
    with pytest.raises(DataError, match=r"row 3, column 2 \(missing values"):
        check_inputs(df, D)
    np.testing.assert_array_equal(check_labels(pd.Series(y), 40, C), y)
    pixels = pd.DataFrame(x.astype(np.uint8))  # uint8 frames are pixels, as uint8 arrays: kept uint8 (scaled by 1/255)
    assert check_inputs(pixels, D).dtype == np.uint8


class _FakeCudaArray:
    """An object exporting __cuda_array_interface__, as torch/CuPy/JAX GPU arrays do."""

    def __init__(self, shape=(40, D), typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (0xDEAD000, False), "strides": strides, "version": 3
        }  # fmt: skip


def test_gpu_arrays_on_the_cpu_engine_say_how_to_bring_them_over():
    t = Trainer(MLP([D, C]), device="cpu")
    with pytest.raises(DataError, match=r"runs on the CPU: pass a host array \(torch: x.cpu\(\).numpy\(\)"):
        t.fit(_FakeCudaArray(), np.zeros(40, int))
    with pytest.raises(DataError, match="runs on the CPU"):
        t.predict(_FakeCudaArray())


@pytest.mark.parametrize(
    ("arr", "words"),
    [
        (_FakeCudaArray(typestr="<f8"), ["float64", "uint8 or float32", "x.float()"]),
        (_FakeCudaArray(strides=(4, 160)), ["strides", "not C-contiguous", "x.contiguous()"]),
        (_FakeCudaArray(shape=(40, D + 1)), ["7 features"]),
    ],
    ids=["float64", "fortran", "width"],
)
def test_gpu_arrays_are_checked_before_any_work(arr, words):
    with pytest.raises(DataError) as info:
        check_inputs(arr, D, "x", gpu=True)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def _described(**fields) -> _FakeCudaArray:
    """A fake GPU array of shape (40, D) float32 whose __cuda_array_interface__ has `fields` changed (None: removed
    where the key is "version", else set)."""
    arr = _FakeCudaArray()
    arr.__cuda_array_interface__.update(fields)
    return arr


MALFORMED = {  # issue 23 item 17: each was accepted (or crashed) before: (fields, words the message must hold)
    "negative rows": (dict(shape=(-5, D)), ["shape (-5, 6)", "integers >= 0"]),
    "fractional rows": (dict(shape=(2.9, D)), ["shape (2.9, 6)", "integers >= 0"]),
    "bool in shape": (dict(shape=(True, D)), ["shape (True, 6)"]),
    "shape not a tuple": (dict(shape="40x6"), ["shape '40x6'"]),
    "object typestr": (dict(typestr="|O8"), ["typestr '|O8'", "real number type"]),
    "big-endian": (dict(typestr=">f4"), ["typestr '>f4'", "native byte order"]),
    "complex": (dict(typestr="<c8"), ["typestr '<c8'"]),
    "typestr not a string": (dict(typestr=4), ["typestr 4"]),
    "unknown typestr": (dict(typestr="<q9"), ["typestr '<q9'"]),
    "masked": (dict(mask=_FakeCudaArray()), ["masked GPU array", "without a mask"]),
    "version 4": (dict(version=4), ["version 4", "versions 0 to 3"]),
    "version str": (dict(version="3"), ["version '3'"]),
    "no version": (dict(version=None), ["version None"]),
    "float strides": (dict(strides=(24.0, 4)), ["strides (24.0, 4)", "2 integers"]),
    "short strides": (dict(strides=(4,)), ["strides (4,)", "2 integers"]),
    "negative pointer": (dict(data=(-8, False)), ["data (-8, False)", "(pointer, read_only)"]),
    "no data": (dict(data=None), ["data None"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_a_gpu_array_description_is_checked_before_anything_reads_it(case, gpu):
    fields, words = MALFORMED[case]
    with pytest.raises(DataError) as info:
        check_inputs(_described(**fields), D, "x", gpu=gpu)
    for w in ("x", *words):
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("case", ["negative rows", "object typestr", "masked", "version 4"])
def test_gpu_labels_are_described_before_any_copy(case, monkeypatch):
    # A CuPy int64 array re-described as "|O8" was copied into a NumPy object array: SIGSEGV on the H100.
    from fastnn import _gpu_arrays as gpu_arrays
    monkeypatch.setattr(gpu_arrays.CudaArray, "to_host", lambda self: pytest.fail("copied before the check"))
    fields, words = MALFORMED[case]
    y = _described(**{"shape": (40,), "typestr": "<i8", **fields})
    with pytest.raises(DataError) as info:
        check_labels(y, 40, C, "y", gpu=True)
    for w in ("y", *words):
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(shape=(40,), typestr="<f4"), ["float32", "integer dtype", "y.long()"]),
        (dict(shape=(40, 2), typestr="<i8"), ["1-D", "(40, 2)"]),
        (dict(shape=(39,), typestr="<i8"), ["39 labels", "40 rows"]),
    ],
    ids=["float", "2-D", "count"],
)
def test_gpu_labels_of_the_wrong_shape_or_type_are_refused_before_any_copy(fields, words, monkeypatch):
    from fastnn import _gpu_arrays as gpu_arrays
    monkeypatch.setattr(gpu_arrays.CudaArray, "to_host", lambda self: pytest.fail("copied before the check"))
    with pytest.raises(DataError) as info:
        check_labels(_described(**fields), 40, C, "y", gpu=True)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_gpu_labels_on_a_cpu_trainer_are_refused_before_any_cuda_library_loads(monkeypatch):
    # Without a GPU driver this raised the library loader's DynamicLibNotFoundError from the label copy (the
    # copy is what loads the CUDA driver library).
    from fastnn import _gpu_arrays as gpu_arrays
    monkeypatch.setattr(gpu_arrays.CudaArray, "to_host", lambda self: pytest.fail("copied on a CPU trainer"))
    t = Trainer(MLP([D, C]), device="cpu")
    x, y = _xy()
    y_dev = _described(shape=(40,), typestr="<i8")
    for call, name in (
        (lambda: t.fit(x, y_dev), "y"),
        (lambda: t.fit(x, y, eval_data=(x, y_dev)), "eval_data[1]"),
        (lambda: t.evaluate(x, y_dev), "y"),
    ):
        with pytest.raises(DataError, match=rf"{re.escape(name)} is .* in GPU memory .* runs on the CPU: pass a host"):
            call()
    assert (t.epoch, t.step) == (0, 0)


def test_a_gpu_array_of_the_right_kind_is_used_in_place():
    arr = _FakeCudaArray()
    got = check_inputs(arr, D, "x", gpu=True)
    assert got.owner is arr and got.ptr == 0xDEAD000 and got.shape == (40, D) and got.nbytes == 40 * D * 4


def test_per_feature_normalize_with_equal_entries_is_the_scalar_one():
    x, y = _xy()
    x = x.astype(np.uint8)
    a = Trainer(MLP([D, 4, C]), batch_size=8, device="cpu", normalize=(0.3, 0.2))
    b = Trainer(MLP([D, 4, C]), batch_size=8, device="cpu", normalize=([0.3] * D, np.full(D, 0.2)))
    a.fit(x, y, epochs=2, progress=False)
    b.fit(x, y, epochs=2, progress=False)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])


def test_per_feature_normalize_is_applied_per_column():
    x, y = _xy()
    mean, std = np.linspace(0.1, 0.6, D), np.linspace(0.5, 2.0, D)
    a = Trainer(MLP([D, C]), batch_size=8, device="cpu", normalize=(mean, std))
    b = Trainer(MLP([D, C]), batch_size=8, device="cpu")
    xf = x.astype(np.float32)
    a.fit(xf, y, epochs=1, progress=False)
    b.fit(((xf - mean) / std).astype(np.float32), y, epochs=1, progress=False)
    for k, v in a.state_dict().items():
        np.testing.assert_allclose(v, b.state_dict()[k], rtol=1e-5, atol=1e-6)


def test_a_bad_per_feature_std_is_quoted_briefly():
    std = np.ones(784)
    std[[3, 10, 11, 500, 700]] = 0.0
    with pytest.raises(fastnn.ConfigError) as info:
        Trainer(MLP([784, 10]), device="cpu", normalize=(0.0, std))
    msg = str(info.value)
    assert "std[3] = 0.0, std[10] = 0.0, std[11] = 0.0, ... (5 of 784 entries)" in msg and len(msg) < 400, msg
    with pytest.raises(fastnn.ConfigError, match=r"vector of 784 numbers .* got shape \(783,\)"):
        Trainer(MLP([784, 10]), device="cpu", normalize=(np.zeros(783), 1.0))


def test_per_feature_normalize_survives_a_checkpoint(tmp_path):
    x, y = _xy()
    t = Trainer(MLP([D, C]), batch_size=8, device="cpu", normalize=(np.linspace(0, 1, D), 2.0))
    t.fit(x, y, epochs=1, progress=False)
    t.save(tmp_path / "m.npz")
    back = Trainer.load(tmp_path / "m.npz", device="cpu")
    assert back.config.normalize == t.config.normalize
    np.testing.assert_array_equal(back.predict_proba(x), t.predict_proba(x))
