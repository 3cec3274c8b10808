"""fastnn: train small and mid-size neural networks on an NVIDIA GPU, one CUDA graph per epoch.

Importing fastnn needs only NumPy: the CUDA libraries are loaded when a GPU engine is built.
"""

from . import datasets, schedules
from .control import EarlyStopping, StopTraining
from .errors import ConfigError, DataError, DeviceUnavailable, FastnnError, TrainingDiverged
from .history import History
from .model import MLP
from .optim import SGD, AdamW
from .trainer import Trainer

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
