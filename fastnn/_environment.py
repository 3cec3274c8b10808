"""Which CUDA major each installed CUDA package belongs to, and whether they agree.

Installing a package that depends on another CUDA (torch with CUDA 13 beside `fastnn-cuda[cu12]`, say) can replace
cuda-bindings 12 with 13 and add CUDA 13 libraries next to the CUDA 12 ones, silently. fastnn runs with either
major as long as cuda-bindings and the NVRTC, cuBLAS and cuDNN wheels belong to the same one; this module finds
out from the installed distributions' metadata (no CUDA library is loaded) and says how to fix a mixture.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ._install import pip_install

__all__ = ["CudaPackages", "cuda_packages"]

#: distribution name -> the CUDA major its libraries are built for (None: read it from the version).
_LIBRARY_WHEELS: dict[str, int | None] = {
    "nvidia-cublas-cu12": 12,
    "nvidia-cudnn-cu12": 12,
    "nvidia-cuda-nvrtc-cu12": 12,
    "nvidia-cublas": None,  # CUDA 13 wheels drop the suffix; their version's major is the CUDA major
    "nvidia-cudnn-cu13": 13,
    "nvidia-cuda-nvrtc": None,
}


@dataclass(frozen=True)
class CudaPackages:
    """The CUDA packages installed: cuda-bindings' version and each library wheel's (name, version, CUDA major)."""

    bindings: str | None
    libraries: tuple[tuple[str, str, int], ...]

    @property
    def bindings_major(self) -> int | None:
        return int(self.bindings.split(".")[0]) if self.bindings else None

    @property
    def majors(self) -> set[int]:
        """Every CUDA major present among cuda-bindings and the library wheels."""
        found = {major for _, _, major in self.libraries}
        return found | ({self.bindings_major} if self.bindings_major else set())

    def problem(self) -> str | None:
        """None when the packages agree (or none is installed), else what is mixed and how to fix it."""
        if len(self.majors) <= 1:
            return None
        listed = ", ".join(
            ([f"cuda-bindings {self.bindings} (CUDA {self.bindings_major})"] if self.bindings else [])
            + [f"{name} {version} (CUDA {major})" for name, version, major in self.libraries]
        )
        b = self.bindings_major
        if b == 13:
            fix = f"{pip_install('cu13')}: CUDA 13 libraries to match cuda-bindings 13 (needs a CUDA 13 driver)"
        else:
            fix = 'pip install "cuda-bindings>=12,<13" (to match the CUDA 12 libraries)'
        stale = [name for name, _, major in self.libraries if major != b] if b else []
        if stale:
            fix += " and, once nothing needs them, pip uninstall " + " ".join(stale)
        return f"mixed CUDA installation: {listed}; fastnn needs one CUDA major throughout. Fix: {fix}"

    def summary(self) -> str:
        """One line for `fastnn info`."""
        if not self.bindings and not self.libraries:
            return f"none installed: CPU only (for a GPU: {pip_install('cu12')}, or cu13)"
        return self.problem() or f"CUDA {min(self.majors)} throughout (cuda-bindings and the library wheels agree)"


def cuda_packages(distributions: Callable[[], Iterable] = importlib.metadata.distributions) -> CudaPackages:
    """The installed CUDA packages, read from distribution metadata (`distributions` is replaceable for tests)."""
    bindings, libraries = None, []
    for dist in distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "cuda-bindings":
            bindings = dist.version
        elif name in _LIBRARY_WHEELS:
            major = _LIBRARY_WHEELS[name]
            try:
                major = int(dist.version.split(".")[0]) if major is None else major
            except ValueError:
                continue
            libraries.append((name, dist.version, major))
    return CudaPackages(bindings, tuple(sorted(set(libraries))))
