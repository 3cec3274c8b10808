"""Integers crossing into C are range-checked, never wrapped; CPU only: the checks run
before any GPU work, and cuDNN/cuBLASLt descriptors can be created without a GPU."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fastnn import MLP, ConfigError, DataError, Trainer
from fastnn._data import MAX_ROWS, check_inputs
from fastnn.cuda._loader import c_int_value, checked_argtype, int_range


def test_int_range_of_ctypes_integers():
    assert int_range(ctypes.c_int32) == (-(2**31), 2**31 - 1)
    assert int_range(ctypes.c_uint32) == (0, 2**32 - 1)
    assert int_range(ctypes.c_uint64) == (0, 2**64 - 1)
    assert int_range(ctypes.c_int64) == (-(2**63), 2**63 - 1)
    assert int_range(ctypes.c_void_p) is None and int_range(ctypes.c_float) is None


def test_checked_argtype_refuses_what_ctypes_would_wrap():
    libc_abs = ctypes.CDLL(None).abs
    libc_abs.restype = ctypes.c_int
    libc_abs.argtypes = [ctypes.c_int]
    assert libc_abs(2**32 + 8) == 8  # what ctypes does unchecked: the wrap this guards against
    libc_abs.argtypes = [checked_argtype(ctypes.c_int)]
    assert libc_abs(-5) == 5 and libc_abs(np.int64(7)) == 7 and libc_abs(ctypes.c_int(-3)) == 3
    with pytest.raises(ctypes.ArgumentError, match="4294967304 does not fit C type c_int"):
        libc_abs(2**32 + 8)
    with pytest.raises(ctypes.ArgumentError, match="must be an integer"):
        libc_abs(1.5)


@pytest.mark.parametrize(
    ("ctype", "value"), [(ctypes.c_int32, 2**31), (ctypes.c_int32, -(2**31) - 1), (ctypes.c_uint32, -1)]
)
def test_c_int_value_names_what_and_value(ctype, value):
    with pytest.raises(ConfigError, match=f"rows = {value} does not fit C type"):
        c_int_value(ctype, value, "rows")


def test_kernel_arguments_are_range_checked():
    driver = pytest.importorskip("fastnn.cuda.driver")  # cuda-bindings; no GPU needed
    assert driver.arg_i32(2**31 - 1).value == 2**31 - 1 and driver.arg_i32(-(2**31)).value == -(2**31)
    assert driver.arg_u32(2**32 - 1).value == 2**32 - 1 and driver.arg_u64(2**64 - 1).value == 2**64 - 1
    cases = [
        (driver.arg_i32, 2**31, "int32 argument = 2147483648"),  # the gather's pos0 past 2**31 rows
        (driver.arg_u32, 2**32, "uint32 argument = 4294967296"),
        (driver.arg_u32, -1, "uint32 argument = -1"),
        (driver.arg_u64, 2**64, "uint64 argument = 18446744073709551616"),
        (driver.arg_ptr, -8, "pointer argument = -8"),
        (driver.arg_i32, 1.5, "must be an integer"),
        (driver.arg_f32, 1e39, "overflows float32"),
    ]
    for fn, value, words in cases:
        with pytest.raises(ConfigError, match=words):
            fn(value)


def test_kernel_arguments_beyond_the_common_case_take_the_full_check():
    """arg_* decide a Python int in range or a float within float32's range in a comparison; anything else (numpy
    numbers, bools, floats at float32's edge, NaN) gets what the full check gives."""
    driver = pytest.importorskip("fastnn.cuda.driver")
    assert driver.arg_ptr(np.uint64(2**64 - 256)).value == 2**64 - 256 and driver.arg_ptr(0).value is None
    assert driver.arg_i32(np.int32(-7)).value == -7 and driver.arg_i32(True).value == 1
    assert driver.arg_u32(np.uint8(200)).value == 200 and driver.arg_u64(np.int64(5)).value == 5
    f32_max = float(np.finfo(np.float32).max)
    assert driver.arg_f32(f32_max).value == f32_max and driver.arg_f32(np.float64(-0.25)).value == -0.25
    assert driver.arg_f32(3.4028235e38).value == f32_max  # above float32's largest, but rounds down to it
    assert np.isnan(driver.arg_f32(float("nan")).value) and driver.arg_f32(-np.inf).value == -np.inf
    for fn, value in ((driver.arg_f32, 3.4028236e38), (driver.arg_f32, -1e39), (driver.arg_u64, np.int64(-1)),
                      (driver.arg_ptr, 2**64), (driver.arg_i32, np.float32(1.0))):  # fmt: skip
        with pytest.raises(ConfigError):
            fn(value)


def test_cudnn_tensor_of_2_pow_32_plus_8_rows_is_refused():
    cudnn = pytest.importorskip("fastnn.cuda.cudnn")
    try:
        cudnn._lib()
    except Exception as exc:  # no cuDNN wheel on this machine
        pytest.skip(f"cuDNN not loadable: {exc}")
    with pytest.raises(ConfigError, match=r"\(4294967304, 10, 1, 1\).*4294967304 does not fit C type c_int"):
        cudnn._TensorDesc(cudnn.DataType.FLOAT, 2**32 + 8, 10)  # was silently an 8-row tensor
    with pytest.raises(ConfigError, match=r"Softmax n must be an int in \[1, 2147483647\].*got 4294967304"):
        cudnn.Softmax(None, 2**32 + 8, 10)


def test_cublaslt_attributes_and_layouts_are_range_checked():
    lt = pytest.importorskip("fastnn.cuda.cublaslt")
    try:
        layout = lt._Layout(lt.DataType.R_32F, 4, 4, 4)
    except Exception as exc:
        pytest.skip(f"cuBLASLt not loadable: {exc}")
    with layout:
        with pytest.raises(ConfigError, match="MatrixLayoutAttribute.ROWS = 18446744073709551624 does not fit"):
            layout.set(lt.MatrixLayoutAttribute.ROWS, 2**64 + 8)
        assert layout.get(lt.MatrixLayoutAttribute.ROWS) == 4  # unchanged
    with pytest.raises(ConfigError, match="layout of 18446744073709551624 x 4.*does not fit"):
        lt._Layout(lt.DataType.R_32F, 2**64 + 8, 4, 4)


def test_more_than_2_pow_31_minus_1_rows_is_a_dataerror_before_any_copy():
    x = np.broadcast_to(np.zeros((1, 4), np.uint8), (MAX_ROWS + 1, 4))  # no memory behind it
    with pytest.raises(DataError, match=f"x has {MAX_ROWS + 1} rows; fastnn takes at most {MAX_ROWS}"):
        check_inputs(x, 4)
    y = np.broadcast_to(np.zeros(1, np.int64), (MAX_ROWS + 1,))
    t = Trainer(MLP([4, 3]), device="cpu")
    with pytest.raises(DataError, match="x has 2147483648 rows"):
        t.fit(x, y, epochs=1)
    assert t.epoch == 0
