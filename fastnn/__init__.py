"""fastnn: train small and mid-size neural networks on an NVIDIA GPU, one CUDA graph per epoch.

Importing fastnn needs only NumPy: the CUDA libraries are loaded when a GPU engine is built, `fastnn.datasets` on
its first use. The public API is `__all__` and the modules `fastnn.datasets`, `fastnn.schedules`, `fastnn.sklearn`,
`fastnn.distributed` (and, advanced, `fastnn.engine.Tuning`); modules with underscore names are fastnn's own.
"""

from . import schedules
from ._control import EarlyStopping, StopTraining
from ._errors import ConfigError, DataError, DeviceUnavailable, FastnnError, NotFittedError, TrainingDiverged
from ._history import History
from ._model import MLP
from ._multi import MultiTrainer
from ._optim import SGD, AdamW
from ._trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "MLP",
    "SGD",
    "AdamW",
    "ConfigError",
    "DataError",
    "DeviceUnavailable",
    "EarlyStopping",
    "FastnnError",
    "History",
    "MultiTrainer",
    "NotFittedError",
    "StopTraining",
    "Trainer",
    "TrainingDiverged",
    "__version__",
    "datasets",
    "schedules",
]

# The errors live in an internal module; a traceback names them as users import and catch them
# (`fastnn.DataError: ...`, not `fastnn._errors.DataError`), and they pickle by that name. Other classes keep their
# real module, which `inspect.getsource` and `typing.get_type_hints` read.
for _error in (ConfigError, DataError, DeviceUnavailable, FastnnError, NotFittedError, StopTraining, TrainingDiverged):
    _error.__module__ = __name__
del _error

#: Public submodules imported on first use (PEP 562): `fastnn.datasets` brings hashing, JSON, gzip and the decoded
#: cache's file handling, a third of `import fastnn` that a user with arrays of their own never needs.
_LAZY_MODULES = ("datasets",)


def __getattr__(name: str) -> object:
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)  # the import also sets it as this module's attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_MODULES})
