"""fastnn's CUDA bindings: the only layer that touches ctypes, C names and status codes.

Importing this package loads nothing; each binding module loads its library on first use. Submodules:
`driver` (cuda.bindings.driver), `nvrtc` (run-time compilation of native/*.cu), `cublaslt`, `cudnn`.
"""

from ._capture import deferring
from ._loader import CudaDriverError, CudaLibraryError, NvrtcError, library_path, load_library

__all__ = ["CudaDriverError", "CudaLibraryError", "NvrtcError", "deferring", "library_path", "load_library"]
