"""What a checkpoint holds for a trainer: its config, counters and history as JSON, and the names and shapes of its
state's arrays. `Trainer.save` writes with these and checks what it wrote as `Trainer.load` will; the file format
itself (zip members, atomic writes) is `_checkpoint.py`'s."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _history
from ._history import History, check_records, encode_records
from ._model import MLP, param_names
from ._optim import OPTIMIZERS, Optimizer
from ._state import check_counters, checked_state
from .engine.base import EngineConfig

__all__ = ["check_loadable", "checked_progress", "param_shapes", "saved_config", "saved_model", "state_shapes"]


def saved_config(config: EngineConfig, epoch: int, step: int, history: History) -> dict[str, Any]:
    """The JSON config of a checkpoint: the model, optimizer and settings, the counters and the history (its last
    `_history.SAVED_RECORDS` epochs)."""
    return {
        "model": {"sizes": list(config.model.sizes), "activation": config.model.activation},
        "optimizer": {"class": type(config.optimizer).__name__, **dataclasses.asdict(config.optimizer)},
        "batch_size": config.batch_size,
        "precision": config.precision,
        "seed": config.seed,
        "normalize": None if config.normalize is None else list(config.normalize),
        "drop_last": config.drop_last,
        "loss": config.loss,
        "epoch": epoch,
        "step": step,
        "history": encode_records(history[-_history.SAVED_RECORDS :]),  # NaN results as "nan": strict JSON
        "history_epoch_base": 1,  # records number epochs from 1 (files without this key: from 0)
    }


def check_loadable(saved: dict[str, Any], state: Mapping[str, np.ndarray], config: EngineConfig) -> None:
    """Raise what `Trainer.load` would (DataError, or ValueError naming the entry) for the checkpoint of `saved`
    (from `saved_config`) and `state`: `save` writes nothing load would refuse."""
    checked_progress(json.loads(json.dumps(saved)))  # what load will read back, NaN and all
    json.dumps(saved, allow_nan=False)  # and nothing else non-finite: the file holds strict JSON
    checked_state(state, state_shapes(config.model, config.optimizer), config.precision, "state")


def checked_progress(config: Mapping[str, Any]) -> tuple[int, int, History]:
    """(epoch, step, history) of a checkpoint's config; ValueError names what is wrong. `save` checks with it too."""
    epoch, step = check_counters(config["epoch"], config["step"])
    base = config.get("history_epoch_base", 0)  # files written before records numbered epochs from 1 lack it
    if isinstance(base, bool) or base not in (0, 1):
        raise ValueError(f"history_epoch_base must be 0 or 1, got {base!r}")
    records = check_records(config.get("history", []), first=base)
    return epoch, step, History({**r, "epoch": r["epoch"] + 1 - base} for r in records)


def saved_model(config: Mapping[str, Any]) -> tuple[MLP, Optimizer]:
    """The model and optimizer a checkpoint's config describes (KeyError, TypeError or ValueError if invalid)."""
    model = MLP(**config["model"])
    opt_fields = dict(config["optimizer"])
    opt_class = {c.__name__: c for c in OPTIMIZERS}[opt_fields.pop("class")]
    return model, opt_class(**opt_fields)  # each class takes its fields as JSON gives them (lists for tuples)


def state_shapes(model: MLP, optimizer: Optimizer) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every array of the training state: the parameters, then "opt.<state>.<param>"."""
    shapes = param_shapes(model)
    for name, shape in list(shapes.items()):
        for s in optimizer.state_names:
            shapes[f"opt.{s}.{name}"] = shape
    return shapes


def param_shapes(model: MLP) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, torch's layout: weight (out, in), bias (out,)."""
    names = iter(param_names(model))
    shapes: dict[str, tuple[int, ...]] = {}
    for fan_in, fan_out in model.layers:
        shapes[next(names)] = (fan_out, fan_in)
        shapes[next(names)] = (fan_out,)
    return shapes
