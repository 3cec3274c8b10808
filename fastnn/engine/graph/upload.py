"""Host data into the GPU engines' buffers: staged through pinned memory in chunks, a GPU array copied in place, and
the identity of the data last uploaded, so that a fit on the same arrays uploads nothing."""

from __future__ import annotations

import numpy as np

from ..._gpu_arrays import CudaArray, check_on_device
from ...cuda import driver

__all__ = ["DataKey", "data_key", "upload"]

STAGING_BYTES = 8 << 20  # pinned staging chunk: pageable copies are slower


def upload(dev: driver.Device, stream: driver.Stream, dst, array: np.ndarray | CudaArray) -> None:
    """Host -> device through a pinned staging buffer in chunks (pageable copies are slower); an array already
    in this GPU's memory is copied device to device once every stream of the device is done with it."""
    if isinstance(array, CudaArray):
        check_on_device(array, dev.ordinal, "x")
        dev.synchronize()  # the producer (torch, CuPy, JAX: any stream) has finished writing it
        if isinstance(dst, driver.MappedHostBuffer):
            driver.copy_dtoh(dst.host_ptr, array.ptr, array.nbytes, stream)
        else:
            driver.copy_dtod(dst.ptr, array.ptr, array.nbytes, stream)
        stream.synchronize()  # fastnn holds no reference to it once fit/evaluate/predict return
        return
    if isinstance(dst, driver.MappedHostBuffer):  # host memory the GPU reads: a plain host copy
        stream.synchronize()  # no queued epoch may still be reading the old rows
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        dst.view(np.uint8, (raw.size,))[:] = raw
        return
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    chunk = max(1, min(raw.size, STAGING_BYTES))
    staging = driver.PinnedBuffer(chunk)
    try:
        view = staging.view(np.uint8, (chunk,))
        for start in range(0, raw.size, chunk):
            part = raw[start : start + chunk]
            view[: part.size] = part
            driver.copy_htod(dst.ptr + start, staging.ptr, part.size, stream)
            stream.synchronize()  # the staging buffer is refilled for the next chunk
    finally:
        staging.close()


class DataKey:
    """Identity of the host data last uploaded: the same x array (held, so its id cannot be reused) and
    equal labels (`Trainer` converts labels to int32 on every call, so they are compared by value) are
    not uploaded again. An x changed in place since is not noticed: pass a new array."""

    def __init__(self, x: np.ndarray, y: np.ndarray | None) -> None:
        self.x, self.y = x, None if y is None else y.copy()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DataKey) or other.x is not self.x:
            return False
        if self.y is None or other.y is None:
            return self.y is other.y
        return self.y.shape == other.y.shape and bool(np.array_equal(self.y, other.y))


def data_key(x: np.ndarray | CudaArray, y: np.ndarray | None) -> DataKey:
    # A GPU array is copied again on every call (device to device: cheap) and never held by the engine.
    return DataKey(object() if isinstance(x, CudaArray) else x, y)

