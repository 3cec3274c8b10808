"""`Trainer`: the user's words. It validates every argument before any work, then drives an engine.

The trainer owns the bookkeeping that outlives one `fit` call (epochs and steps done, the history);
the engine owns the parameters and optimizer state. A call that fails validation changes nothing.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import checkpoint
from .data import check_inputs, check_labels, check_normalize
from .engine.base import PRECISIONS, EngineConfig, EpochStats, steps_per_epoch
from .engine.select import DEVICES, create_engine
from .errors import ConfigError, DataError, FastnnError
from .history import FIELDS, History
from .model import MLP, init_parameters, param_names
from .optim import SGD, AdamW, Optimizer
from .progress import print_epoch
from .schedules import Schedule, bind, check_schedule, lr_table

__all__ = ["Trainer"]


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """`value` as an int in [lo, hi); bools and floats are refused so a typo cannot pass silently."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi and value >= hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
        raise ConfigError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def _check_device(device: Any) -> str:
    if not isinstance(device, str) or device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    return device


class Trainer:
    """Trains an `MLP` with an optimizer on the CPU (NumPy) or the GPU (one CUDA graph per epoch).

    Args:
        model: the network, e.g. `MLP([784, 128, 10])`.
        optimizer: `SGD` or `AdamW`; None means `SGD(lr=0.1)`.
        batch_size: samples per step; the last short batch of an epoch is a step too unless `drop_last`.
        precision: "mixed" (fp16 operands, fp32 accumulation and weights), "fp16" or "fp32"; the CPU computes fp32.
        device: "cpu", "cuda", or "auto" (the GPU when usable, else the CPU with a warning).
        seed: keys the initial weights and every epoch's sample order; an integer in [0, 2**64).
        schedule: a callable global step -> lr (see `fastnn.schedules`); None keeps the optimizer's lr.
        normalize: None or (mean, std) applied after uint8 inputs are scaled to [0, 1].
        drop_last: drop each epoch's last batch when it is short.

    Raises:
        ConfigError: an argument is invalid (the message names it).
        DeviceUnavailable: device="cuda" and no usable GPU.
    """

    def __init__(
        self,
        model: MLP,
        optimizer: Optimizer | None = None,
        batch_size: int = 128,
        precision: str = "mixed",
        device: str = "auto",
        seed: int = 0,
        schedule: Schedule | None = None,
        normalize: tuple[float, float] | None = None,
        drop_last: bool = False,
    ) -> None:
        if not isinstance(model, MLP):
            raise ConfigError(f"model must be a fastnn.MLP, got {reprlib.repr(model)}")
        if optimizer is None:
            optimizer = SGD(lr=0.1)
        if not isinstance(optimizer, (SGD, AdamW)):
            raise ConfigError(f"optimizer must be fastnn.SGD or fastnn.AdamW, got {reprlib.repr(optimizer)}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        _check_device(device)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")
        self._config = EngineConfig(
            model=model,
            optimizer=optimizer,
            batch_size=_check_int("batch_size", batch_size, 1),
            precision=precision,
            seed=_check_int("seed", seed, 0, 2**64),
            drop_last=bool(drop_last),
            normalize=check_normalize(normalize),
        )
        self._schedule = bind(schedule, optimizer.lr)
        self._engine = create_engine(device, self._config, init_parameters(model, self._config.seed), stacklevel=2)
        self._closed = False
        self.epoch = 0  #: epochs trained so far, over every fit call; keys the next epoch's shuffle
        self.step = 0  #: optimizer steps taken so far; the schedule and AdamW's bias correction count these
        self.history = History()  #: every epoch ever trained by this trainer (fit returns one call's)

    # ---- properties -------------------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """ "cpu" or "cuda": where training actually runs (what "auto" resolved to)."""
        return self._engine.device

    @property
    def model(self) -> MLP:
        return self._config.model

    @property
    def optimizer(self) -> Optimizer:
        return self._config.optimizer

    @property
    def config(self) -> EngineConfig:
        """The validated configuration the engine was built from."""
        return self._config

    def __repr__(self) -> str:
        c = self._config
        return (
            f"Trainer(model={c.model!r}, optimizer={c.optimizer!r}, batch_size={c.batch_size}, "
            f"precision={c.precision!r}, device={self.device!r}, seed={c.seed}, epoch={self.epoch})"
        )

    # ---- training ---------------------------------------------------------------------------------------------

    def fit(
        self,
        x: Any,
        y: Any,
        epochs: int = 1,
        eval_data: tuple[Any, Any] | None = None,
        eval_every: int = 1,
        progress: bool = False,
    ) -> History:
        """Train `epochs` more epochs on (x, y); returns this call's History (`self.history` holds all).

        x is (N, in_features) uint8 (scaled by 1/255) or float; y is (N,) integer labels. With eval_data
        = (x_eval, y_eval), evaluate after every `eval_every`-th epoch of this call and after its last.
        Everything is validated, and the schedule evaluated for every step, before any training.

        Raises:
            DataError: x, y or eval_data are malformed (the message names which).
            ConfigError: epochs, eval_every, progress or the schedule are invalid.
            TrainingDiverged: the loss became non-finite; the weights of the last finite epoch are kept.
        """
        self._check_open()
        model, cfg = self._config.model, self._config
        x = check_inputs(x, model.in_features, "x")
        y = check_labels(y, x.shape[0], model.classes, "y")
        epochs = _check_int("epochs", epochs, 0)
        eval_set = self._check_eval_data(eval_data)
        eval_every = _check_int("eval_every", eval_every, 1)
        if not isinstance(progress, (bool, np.bool_)):
            raise ConfigError(f"progress must be True or False, got {progress!r}")
        spe = steps_per_epoch(x.shape[0], cfg.batch_size, cfg.drop_last)
        if spe == 0:
            raise DataError(
                f"x has {x.shape[0]} rows, fewer than batch_size={cfg.batch_size} with drop_last=True: "
                f"an epoch would have no steps"
            )
        lrs = lr_table(self._schedule, self.step, epochs * spe)
        call_history = History()
        if epochs == 0:
            return call_history
        eval_after = frozenset(k for k in range(epochs) if (k + 1) % eval_every == 0 or k == epochs - 1)
        last_epoch = self.epoch + epochs - 1

        def on_epoch(stats: EpochStats) -> None:
            record = {
                "epoch": stats.epoch,
                "train_loss": float(stats.loss),
                "train_accuracy": float(stats.accuracy),
                "eval_loss": None if stats.eval_loss is None else float(stats.eval_loss),
                "eval_accuracy": None if stats.eval_accuracy is None else float(stats.eval_accuracy),
                "seconds": float(stats.seconds),
            }
            self.epoch = stats.epoch + 1
            self.step += spe
            call_history.append(record)
            self.history.append(record)
            if progress:
                print_epoch(record, last_epoch)

        self._engine.set_train_data(x, y)
        self._engine.fit_epochs(self.epoch, self.step, lrs, eval_set, eval_after if eval_set else frozenset(), on_epoch)
        return call_history

    def _check_eval_data(self, eval_data: Any) -> tuple[np.ndarray, np.ndarray] | None:
        if eval_data is None:
            return None
        if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
            if isinstance(eval_data, (tuple, list)):
                got = f"a {type(eval_data).__name__} of {len(eval_data)} items"
            else:
                got = reprlib.repr(eval_data)
            raise DataError(f"eval_data must be a pair (x_eval, y_eval), got {got}")
        ex = check_inputs(eval_data[0], self._config.model.in_features, "eval_data[0]")
        ey = check_labels(eval_data[1], ex.shape[0], self._config.model.classes, "eval_data[1]")
        return ex, ey

    # ---- inference --------------------------------------------------------------------------------------------

    def evaluate(self, x: Any, y: Any) -> dict[str, float]:
        """{"loss": mean cross-entropy, "accuracy": fraction correct} of the current weights on (x, y)."""
        self._check_open()
        x = check_inputs(x, self._config.model.in_features, "x")
        y = check_labels(y, x.shape[0], self._config.model.classes, "y")
        loss, accuracy = self._engine.evaluate(x, y)
        return {"loss": float(loss), "accuracy": float(accuracy)}

    def predict_proba(self, x: Any) -> np.ndarray:
        """Softmax class probabilities, (N, classes) float32."""
        self._check_open()
        return self._engine.predict_proba(check_inputs(x, self._config.model.in_features, "x"))

    def predict(self, x: Any) -> np.ndarray:
        """The most probable class of each row, (N,) int64."""
        return self.predict_proba(x).argmax(axis=1)

    # ---- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """float32 copies of the parameters keyed like torch.nn.Sequential: "0.weight" (out, in), "0.bias", ..."""
        self._check_open()
        state = self._engine.get_state()
        return {n: state[n] for n in param_names(self._config.model)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the parameters (not the optimizer state) with `state_dict`'s, checked against the model.

        Raises:
            DataError: a name is missing or unexpected, or an array has the wrong shape or non-finite values.
        """
        self._check_open()
        self._engine.set_state(_checked_arrays(state_dict, _param_shapes(self._config.model), "state_dict"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write config, epoch/step counters, history, parameters and optimizer state to an .npz, atomically."""
        self._check_open()
        c = self._config
        config = {
            "model": {"sizes": list(c.model.sizes), "activation": c.model.activation},
            "optimizer": {"class": type(c.optimizer).__name__, **dataclasses.asdict(c.optimizer)},
            "batch_size": c.batch_size,
            "precision": c.precision,
            "seed": c.seed,
            "normalize": None if c.normalize is None else list(c.normalize),
            "drop_last": c.drop_last,
            "epoch": self.epoch,
            "step": self.step,
            "history": list(self.history),
        }
        checkpoint.save(path, config, self._engine.get_state())

    @classmethod
    def load(cls, path: str | os.PathLike[str], device: str = "auto", schedule: Schedule | None = None) -> Trainer:
        """A trainer restored from `save`'s file, ready to continue exactly where it stopped.

        A schedule is code and is not saved: pass the same `schedule` again to continue with it.

        Raises:
            DataError: the file is missing, not a fastnn checkpoint, from a newer format, or inconsistent.
        """
        # The arrays' names and shapes follow from the config: checked from the headers before any data is read.
        config, arrays = checkpoint.load(path, expect=lambda cfg: _state_shapes(*_saved_model(cfg)))
        where = f"checkpoint {str(path)!r}"
        _check_device(device)  # the caller's arguments, not the file's: these stay ConfigErrors
        check_schedule(schedule)
        try:
            model, optimizer = _saved_model(config)
            kwargs = {k: config[k] for k in ("batch_size", "precision", "seed", "normalize", "drop_last")}
            epoch, step = _check_int("epoch", config["epoch"], 0), _check_int("step", config["step"], 0)
            history = History(_checked_history(config.get("history", [])))
            # before the engine is built: no work on a bad file
            state = _checked_arrays(arrays, _state_shapes(model, optimizer), where)
            trainer = cls(model, optimizer, device=device, schedule=schedule, **kwargs)
        except DataError:
            raise  # already names the file and the array
        except KeyError as exc:
            raise DataError(f"{where} holds an invalid config: no entry {exc}") from exc
        except (TypeError, ValueError) as exc:  # ConfigError is a ValueError: a bad value in the saved config
            raise DataError(f"{where} holds an invalid config: {exc}") from exc
        try:
            trainer._engine.set_state(state)
        except BaseException:
            trainer.close()
            raise
        trainer.epoch, trainer.step, trainer.history = epoch, step, history
        return trainer

    # ---- lifetime ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine's resources (GPU memory, graphs); the trainer is unusable afterwards."""
        if not self._closed:
            self._closed = True
            self._engine.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise FastnnError("this Trainer is closed")


def _checked_history(records: Any) -> list[dict[str, Any]]:
    """A saved history: a list of records of FIELDS, epoch an int, the rest numbers (eval ones may be None)."""
    if not isinstance(records, list):
        raise ValueError(f"history must be a list of records, got {type(records).__name__}")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or set(r) != set(FIELDS):
            raise ValueError(f"history[{i}] must be a record of the fields {FIELDS}, got {r!r}")
        for field, value in r.items():
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if field == "epoch":
                ok, rule = isinstance(value, int) and number and value >= 0, "an integer >= 0"
            elif field.startswith("eval_"):
                ok, rule = value is None or number, "None or a number"
            else:
                ok, rule = number, "a number"
            if not ok:
                raise ValueError(f"history[{i}][{field!r}] must be {rule}, got {value!r}")
    return records


def _saved_model(config: Mapping[str, Any]) -> tuple[MLP, Optimizer]:
    """The model and optimizer a checkpoint's config describes (KeyError, TypeError or ValueError if invalid)."""
    model = MLP(**config["model"])
    opt_fields = dict(config["optimizer"])
    opt_class = {"SGD": SGD, "AdamW": AdamW}[opt_fields.pop("class")]
    if "betas" in opt_fields:
        opt_fields["betas"] = tuple(opt_fields["betas"])
    return model, opt_class(**opt_fields)


def _state_shapes(model: MLP, optimizer: Optimizer) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every array of the training state: the parameters, then "opt.<state>.<param>"."""
    shapes = _param_shapes(model)
    for name, shape in list(shapes.items()):
        for s in optimizer.state_names:
            shapes[f"opt.{s}.{name}"] = shape
    return shapes


def _param_shapes(model: MLP) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, torch's layout: weight (out, in), bias (out,)."""
    names = iter(param_names(model))
    shapes: dict[str, tuple[int, ...]] = {}
    for fan_in, fan_out in model.layers:
        shapes[next(names)] = (fan_out, fan_in)
        shapes[next(names)] = (fan_out,)
    return shapes


def _checked_arrays(arrays: Mapping[str, Any], shapes: dict[str, tuple[int, ...]], what: str) -> dict[str, np.ndarray]:
    """float32 copies of `arrays`, which must hold exactly the names of `shapes`, each finite and of its shape."""
    if not isinstance(arrays, Mapping):
        raise DataError(f"{what} must be a mapping of names to arrays, got {type(arrays).__name__}")
    missing = [n for n in shapes if n not in arrays]
    unexpected = [n for n in arrays if n not in shapes]
    if missing or unexpected:
        raise DataError(f"{what} does not match the model: missing {missing}, unexpected {unexpected}")
    out = {}
    for name, shape in shapes.items():
        value = arrays[name]
        if hasattr(value, "detach"):  # a torch tensor, possibly on a GPU
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if arr.shape != shape:
            raise DataError(f"{what}[{name!r}] has shape {arr.shape}, the model needs {shape}")
        if arr.dtype.kind not in "fiu" or not np.isfinite(arr).all():
            raise DataError(f"{what}[{name!r}] must hold finite numbers (dtype {arr.dtype})")
        out[name] = arr.astype(np.float32)
    return out
