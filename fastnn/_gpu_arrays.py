"""Arrays already in GPU memory (torch, CuPy, JAX, Numba: anything with `__cuda_array_interface__`).

`cuda_array(obj)` describes such an array without importing its library; the GPU engines then copy it
device-to-device into their own buffers, so it never travels through host memory. Stream semantics: before
reading, fastnn waits for all work queued on the array's device (`cuCtxSynchronize`), so whatever stream
produced the array has finished; fastnn never writes to it, and once `fit`/`evaluate`/`predict` return it
holds no reference to it. Labels given as GPU arrays are copied to the host (4-8 bytes a row) to be
range-checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import DataError

__all__ = ["CudaArray", "check_on_device", "cuda_array"]


@dataclass(frozen=True, eq=False)
class CudaArray:
    """A C-contiguous array in GPU memory, described by its `__cuda_array_interface__`."""

    owner: Any  #: the user's object, held so its memory stays valid while fastnn reads it
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        """For messages: "a torch.Tensor (cuda, float32, shape (60000, 784))"."""
        t = type(self.owner)
        return f"a {t.__module__.split('.')[0]}.{t.__name__} in GPU memory ({self.dtype}, shape {self.shape})"

    def to_host(self) -> np.ndarray:
        """A host copy (used for labels only: they are range-checked on the host)."""
        from .cuda import driver

        device = _pointer_device(self, self.describe())
        if device is None:
            raise DataError(f"{self.describe()} does not point to device memory fastnn can read")
        dev = driver.get_device(device)
        dev.synchronize()  # the producer's streams are done with it
        out = np.empty(self.shape, dtype=self.dtype)
        stream = driver.Stream(dev)
        try:
            driver.copy_dtoh(out.ctypes.data, self.ptr, self.nbytes, stream)
            stream.synchronize()
        finally:
            stream.close()
        return out


#: The `__cuda_array_interface__` versions this reader knows (3 is the current one; 1 added "mask", 2 "strides",
#: 3 "stream"). A newer version may change what a field means: refused rather than guessed.
VERSIONS = (0, 1, 2, 3)


def _index(value: Any) -> int | None:
    """`value` as an int if it is one (Python or NumPy, not bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def cuda_array(obj: Any, name: str) -> CudaArray | None:
    """`obj` as a CudaArray if it lives in GPU memory, else None.

    Every field of its `__cuda_array_interface__` is checked before anything reads its memory, so a wrong
    description cannot make a copy read the wrong bytes or make NumPy build objects from them: version,
    shape (non-negative integers), typestr (a real number type in native byte order), data (an integer pointer),
    strides (C-contiguous), mask (none). A torch tensor that requires grad is refused too.

    Raises:
        DataError: naming `name` and the field.
    """
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except RuntimeError as exc:  # torch: a CUDA tensor that requires grad refuses to export itself
        if getattr(obj, "requires_grad", False):
            raise DataError(f"{name} is a torch.Tensor that requires grad: pass {name}.detach()") from None
        raise DataError(f"{name} is a GPU array that cannot be exported: {exc}") from None
    if not isinstance(cai, dict):
        return None

    def malformed(what: str) -> DataError:
        t = type(obj)
        return DataError(
            f"{name} (a {t.__module__.split('.')[0]}.{t.__name__}) has a malformed __cuda_array_interface__: {what}"
        )

    version = _index(cai.get("version"))
    if version not in VERSIONS:
        raise malformed(f"version {cai.get('version')!r}; fastnn reads versions {VERSIONS[0]} to {VERSIONS[-1]}")
    if cai.get("mask") is not None:
        raise DataError(
            f"{name} is a masked GPU array (its __cuda_array_interface__ has a mask); fastnn reads every entry: "
            f"fill or drop the masked entries and pass the array without a mask"
        )
    raw_shape = cai.get("shape")
    shape = tuple(_index(d) for d in raw_shape) if isinstance(raw_shape, (tuple, list)) else None
    if shape is None or any(d is None or d < 0 for d in shape):
        raise malformed(f"shape {raw_shape!r}; it must be a tuple of integers >= 0")
    typestr = cai.get("typestr")
    try:
        dtype = np.dtype(typestr) if isinstance(typestr, str) else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.fields is not None or not dtype.isnative:
        raise malformed(f"typestr {typestr!r}; it must be a real number type in native byte order (e.g. '<f4', '|u1')")
    data = cai.get("data")
    ptr = _index(data[0]) if isinstance(data, (tuple, list)) and len(data) == 2 else None
    if ptr is None or ptr < 0:
        raise malformed(f"data {data!r}; it must be (pointer, read_only)")
    strides = cai.get("strides")
    if strides is not None:
        given = tuple(_index(st) for st in strides) if isinstance(strides, (tuple, list)) else None
        if given is None or len(given) != len(shape) or None in given:
            raise malformed(f"strides {strides!r}; they must be None or {len(shape)} integers (bytes per step)")
        expected, step = [], dtype.itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if given != tuple(reversed(expected)) and 0 not in shape:
            raise DataError(
                f"{name} is a GPU array with strides {given}, not C-contiguous: pass a contiguous copy "
                f"(torch: {name}.contiguous(); CuPy: cupy.ascontiguousarray({name}))"
            )
    return CudaArray(owner=obj, ptr=ptr, shape=shape, dtype=dtype)  # type: ignore[arg-type]


def check_on_device(arr: CudaArray, ordinals: int | Sequence[int], name: str) -> int:
    """The GPU whose memory holds `arr`; DataError unless it is device `ordinals` (or one of them: a trainer on
    several GPUs), since fastnn reads it from there."""
    device = _pointer_device(arr, f"{name} is {arr.describe()}")
    allowed = [ordinals] if isinstance(ordinals, int) else list(ordinals)
    if device not in allowed:
        where = "host or unknown memory" if device is None else f"GPU {device}"
        trains_on = f"GPU {allowed[0]}" if len(allowed) == 1 else f"GPUs {allowed}"
        raise DataError(f"{name} is {arr.describe()} on {where}, but this trainer trains on {trains_on}")
    return device


def _pointer_device(arr: CudaArray, what: str) -> int | None:
    """The GPU whose memory `arr` points to, None for host or unknown memory; DataError if the driver cannot
    say (the pointer is not one this process can read)."""
    from .cuda import driver

    try:
        return driver.pointer_device(arr.ptr)
    except Exception as exc:
        raise DataError(f"{what} whose device fastnn could not determine: {exc}") from None
