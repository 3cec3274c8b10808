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

from .errors import DataError

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

        device = driver.pointer_device(self.ptr)
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


def cuda_array(obj: Any, name: str) -> CudaArray | None:
    """`obj` as a CudaArray if it lives in GPU memory, else None; raises DataError naming `name` if it is a GPU
    array fastnn cannot read in place (non-contiguous, or a torch tensor that requires grad)."""
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except RuntimeError as exc:  # torch: a CUDA tensor that requires grad refuses to export itself
        if getattr(obj, "requires_grad", False):
            raise DataError(f"{name} is a torch.Tensor that requires grad: pass {name}.detach()") from None
        raise DataError(f"{name} is a GPU array that cannot be exported: {exc}") from None
    if not isinstance(cai, dict):
        return None
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        ptr = int(cai["data"][0] or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{name} has a malformed __cuda_array_interface__: {exc}") from None
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if tuple(strides) != tuple(reversed(expected)) and 0 not in shape:
            raise DataError(
                f"{name} is a GPU array with strides {tuple(strides)}, not C-contiguous: pass a contiguous copy "
                f"(torch: {name}.contiguous(); CuPy: cupy.ascontiguousarray({name}))"
            )
    return CudaArray(owner=obj, ptr=ptr, shape=shape, dtype=dtype)


def check_on_device(arr: CudaArray, ordinals: int | Sequence[int], name: str) -> int:
    """The GPU whose memory holds `arr`; DataError unless it is device `ordinals` (or one of them: a trainer on
    several GPUs), since fastnn reads it from there."""
    from .cuda import driver

    try:
        device = driver.pointer_device(arr.ptr)
    except Exception as exc:  # a driver error: the pointer is not one this process can read
        raise DataError(f"{name} is {arr.describe()} whose device fastnn could not determine: {exc}") from None
    allowed = [ordinals] if isinstance(ordinals, int) else list(ordinals)
    if device not in allowed:
        where = "host or unknown memory" if device is None else f"GPU {device}"
        trains_on = f"GPU {allowed[0]}" if len(allowed) == 1 else f"GPUs {allowed}"
        raise DataError(f"{name} is {arr.describe()} on {where}, but this trainer trains on {trains_on}")
    return device
