"""Engines: what trains a `Trainer`'s model, given a validated `EngineConfig`.

- `numpy_engine.py`: the NumPy engine (`device="cpu"`), the definition of correct;
- `graph/`: the graph engine (engine="graph"), one CUDA graph of library calls per epoch, any model;
- `fused/`: the fused engine (engine="fused"), one persistent kernel per epoch for small models (sm_90+);
- `grid/`: the grid engine (engine="grid"), one cooperative persistent kernel per epoch over up to every SM, for
  MLPs with hidden layers (sm_90+);
- `replicas.py`: the graph engine replicated on several GPUs of one process (`devices=`).

Shared by them: `base.py` (the Engine interface, EngineConfig), `tuning.py` (Tuning: the measured choices as
data), `select.py` (which engine trains), `epochs.py` (the GPU engines' epoch loop), `plan.py` (parameter layout
and precisions), `placement.py` (where the training set lives), `group.py` (a data-parallel group). A new engine
arrives as a package beside `graph/`, `fused/` and `grid/`. Importing this package imports no GPU module.
"""

from .base import PRECISIONS, Engine, EngineConfig, EpochStats, batch_slices, steps_per_epoch
from .tuning import Tuning

__all__ = ["PRECISIONS", "Engine", "EngineConfig", "EpochStats", "Tuning", "batch_slices", "steps_per_epoch"]
