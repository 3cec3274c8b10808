"""A process that loaded the CUDA bindings exits without the garbage collector's last passes over what it made.

At exit CPython clears every module and runs its cyclic garbage collector several times over every object still
alive. With cuda.bindings loaded (its Cython modules hold tens of thousands of objects) those passes cost about
0.1 s of CPU (measured on the CPU machine: 145-165 ms from the script's last line to the process's end, 57 with
the objects frozen, 23 with os._exit), and free nothing the operating system would not: fastnn's GPU objects are
left to the CUDA driver at exit anyway (their finalizers are atexit=False: driver.py, _loader.py). So an atexit
hook freezes the objects alive then (gc.freeze), and the passes skip them. The cost: an object of the program that
sits in a reference cycle at exit is not finalized, which Python never promised (object.__del__: "It is not
guaranteed that __del__() methods are called for objects that still exist when the interpreter exits"); atexit
hooks, weakref.finalize(atexit=True) and objects freed by reference counting are unaffected.
"""

from __future__ import annotations

import atexit
import gc
import threading

__all__ = ["skip_final_collection"]

_lock = threading.Lock()
_registered = False


def skip_final_collection() -> None:
    """Register, once per process, the atexit hook that freezes the objects alive at exit (see the module)."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(gc.freeze)
            _registered = True
