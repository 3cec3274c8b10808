"""Where the GPU engines keep the training set: in GPU memory, or in mapped host memory read over the bus.

`data_placement="device"` (the fastest) keeps it in GPU memory; `"host"` keeps it in page-locked host memory
mapped into the GPU's address space, from which the gather kernel reads each batch's rows inside the same
epoch graph (same sample order and results, slower per step); `"auto"` takes the GPU while the set fits.
"""

from __future__ import annotations

from .._errors import ConfigError, DataError

__all__ = ["DEVICE_FRACTION", "PLACEMENTS", "check_placement", "choose_placement"]

PLACEMENTS = ("auto", "device", "host")

#: "auto" keeps the training set in GPU memory when it takes at most this fraction of the free memory (the rest
#: stays for the model, its batch buffers, cuBLASLt's workspace and other libraries).
DEVICE_FRACTION = 0.8


def check_placement(device: str, data_placement: object) -> str:
    """`data_placement` validated for `device`; the CPU engine keeps its data where it is, so only "auto" there."""
    if not isinstance(data_placement, str) or data_placement not in PLACEMENTS:
        raise ConfigError(f"data_placement must be one of {PLACEMENTS}, got {data_placement!r}")
    if device == "cpu" and data_placement != "auto":
        raise ConfigError(f"data_placement={data_placement!r} places data for a GPU engine, but device='cpu'")
    return data_placement


def choose_placement(requested: str, nbytes: int, free_bytes: int) -> str:
    """ "device" or "host" for a training set of `nbytes` on a GPU with `free_bytes` free.

    Raises:
        DataError: "device" was asked for and the set cannot fit in the free memory.
    """
    if requested == "host":
        return "host"
    fits = nbytes <= DEVICE_FRACTION * free_bytes
    if requested == "device" and nbytes > free_bytes:
        raise DataError(
            f"data_placement='device': the training set takes {nbytes:,} bytes, more than the GPU's {free_bytes:,} "
            f"free bytes: use data_placement='host' (or 'auto')"
        )
    return "device" if requested == "device" or fits else "host"
