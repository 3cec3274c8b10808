"""fastnn: train small and mid-size neural networks on an NVIDIA GPU, one CUDA graph per epoch.

Importing fastnn needs only NumPy: the CUDA libraries are loaded when a GPU engine is built. The public API is
`__all__` and the modules `fastnn.datasets`, `fastnn.schedules`, `fastnn.sklearn`, `fastnn.distributed` (and,
advanced, `fastnn.engine.Tuning`); modules with underscore names are fastnn's own.
"""

from . import datasets, schedules
from ._control import EarlyStopping, StopTraining
from ._errors import ConfigError, DataError, DeviceUnavailable, FastnnError, TrainingDiverged
from ._history import History
from ._model import MLP
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
for _error in (ConfigError, DataError, DeviceUnavailable, FastnnError, StopTraining, TrainingDiverged):
    _error.__module__ = __name__
del _error
