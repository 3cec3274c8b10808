"""Engines that train K models at once (`fastnn.MultiTrainer`), given a validated `ManyConfig`.

- `base`: the ManyEngine interface, ManyConfig (K optimizers, one shuffle seed), what an epoch reports;
- `plan`: pure Python, testable on the CPU: mask groups, the streams of models that share a minibatch, per-model
  tables the GPU engine uploads;
- `numpy_engine`: the NumPy engine, the definition of correct: model k trained by the single-model NumPy engine
  exactly as a separate `Trainer` would train it;
- `gpu/`: the GPU engine (imported only when a GPU is asked for).
"""

from .base import ManyConfig, ManyEngine, ManyEpoch

__all__ = ["ManyConfig", "ManyEngine", "ManyEpoch"]
