"""`MultiTrainer`: K models of one architecture trained as one, each with its own initial weights, learning rate,
weight decay, optimizer hyperparameters and rows (a cross-validation fold), as a leading model axis (JAX `vmap`,
`torch.func.stack_module_state`) in fastnn's words.

Model k is defined as a separate fit: `Trainer(model, optimizer_k, seed=shuffle_seed, ...)` started from
`init_parameters(model, seeds[k])` and fit on `x[masks[k]]`; the NumPy engine computes exactly that, and the GPU
engine matches it to its precision's tolerance. The bookkeeping here (histories, counters, early stopping,
divergence) is per model; the engine trains every model that is still going, one epoch at a time.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import reprlib
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._checks import integer
from ._control import EarlyStopping, check_early_stopping
from ._data import check_inputs, check_labels, check_normalize, check_operand_range, check_targets
from ._errors import ConfigError, DataError, FastnnError, NotFittedError, TrainingDiverged
from ._history import History
from ._many_args import check_masks, model_count, per_model_optimizers, per_model_seeds
from ._model import MLP, init_parameters, param_names
from ._optim import OPTIMIZERS, SGD, Optimizer
from ._state import MAX_EPOCH, MAX_STEP, checked_state
from ._trainer import Trainer
from .engine.base import LOSSES, PRECISIONS, steps_per_epoch
from .engine.many.base import ManyConfig
from .engine.many.plan import mask_groups
from .engine.many.select import check_many_engine, create_many_engine
from .engine.plan import precision_spec
from .engine.select import check_devices
from .engine.tuning import Tuning, check_tuning
from .schedules import Schedule, bind, check_schedule, lr_table

__all__ = ["METRICS", "MultiTrainer"]

#: What `best` ranks by: the history field, and whether smaller is better ("val_*" are accepted for "eval_*").
METRICS = {"eval_loss": True, "eval_accuracy": False, "train_loss": True, "train_accuracy": False}


class MultiTrainer:
    """Trains K models of one architecture at once: each its own seed, learning rate, weight decay, optimizer
    hyperparameters and (in `fit`) rows, sharing one shuffle order and, on the GPU, each minibatch read.

    Every per-model argument is a scalar (the same for every model) or a sequence of K values; K is `models`, or
    else the length of those sequences (which must all agree).

    Args:
        model: the architecture every model has, e.g. `MLP([784, 10])`.
        optimizer: `SGD` or `AdamW` giving the defaults (None: `SGD(lr=0.1)`); every model uses its class.
        models: K, the number of models (None: the length of the per-model sequences).
        lr: learning rate, scalar or per model (None: the optimizer's).
        weight_decay: as the optimizer defines it (SGD: L2 added to the gradient; AdamW: decoupled), scalar or per
            model (None: the optimizer's).
        seeds: each model's initial weights: an int s (model k gets s + k), or K ints; None is 0.
        shuffle_seed: keys every epoch's sample order, shared by the models: `Trainer(seed=shuffle_seed)`'s order.
        batch_size: samples per step, as `Trainer`'s.
        precision: "mixed", "fp16" or "fp32", as `Trainer`'s.
        device: "cpu", "cuda" or "auto" (the GPU when usable, else the CPU with a warning).
        engine: "auto", "numpy" (the CPU) or "gpu".
        devices: the GPU of this process to train on: 1 (the first) or [ordinal] (one GPU: a MultiTrainer is one
            engine; several GPUs train several MultiTrainers, as `fastnn.sklearn.GridSearchCV` spreads its groups).
        normalize: None or (mean, std), as `Trainer`'s.
        drop_last: drop each epoch's last short batch, as `Trainer`'s.
        loss: "cross_entropy" or "mse", as `Trainer`'s.
        tuning: advanced: a `fastnn.engine.Tuning`, the engines' measured choices (benchmarks and tests compare
            variants of the many-model GPU engine's kernels through it; None: the defaults).
        schedule: a schedule for every model; one with `lr=None` (e.g. `schedules.Cosine(total_steps=...)`) takes
            each model's lr, another callable gives every model the same rates.
        **hyperparameters: the optimizer's other fields per model, e.g. `momentum=[0.0, 0.9]` (SGD) or
            `betas=[(0.9, 0.999), (0.8, 0.99)]` (AdamW; one pair is every model's).

    Raises:
        ConfigError: an argument is invalid (the message names it, and the model for a per-model value), a
            sequence's length differs from K, or K is not given.
        DeviceUnavailable: device="cuda" or engine="gpu" and no usable GPU.
    """

    def __init__(
        self,
        model: MLP,
        optimizer: Optimizer | None = None,
        *,
        models: int | None = None,
        lr: float | Sequence[float] | None = None,
        weight_decay: float | Sequence[float] | None = None,
        seeds: int | Sequence[int] | None = None,
        shuffle_seed: int = 0,
        batch_size: int = 128,
        precision: str = "mixed",
        device: str = "auto",
        engine: str = "auto",
        schedule: Schedule | None = None,
        normalize: tuple[Any, Any] | None = None,
        drop_last: bool = False,
        loss: str = "cross_entropy",
        devices: int | Sequence[int] = 1,
        tuning: Tuning | None = None,
        **hyperparameters: Any,
    ) -> None:
        if not isinstance(model, MLP):
            raise ConfigError(f"model must be a fastnn.MLP, got {reprlib.repr(model)}")
        if not isinstance(loss, str) or loss not in LOSSES:
            raise ConfigError(f"loss must be one of {LOSSES}, got {loss!r}")
        if loss == "cross_entropy" and model.classes < 2:
            raise ConfigError(f"model sizes {list(model.sizes)} end in {model.classes} output: a classifier "
                              "(loss='cross_entropy') needs at least 2 classes; for a regression pass loss='mse'")
        optimizer = SGD(lr=0.1) if optimizer is None else optimizer
        if not isinstance(optimizer, OPTIMIZERS):
            names = " or ".join(f"fastnn.{c.__name__}" for c in OPTIMIZERS)
            raise ConfigError(f"optimizer must be {names}, got {reprlib.repr(optimizer)}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        check_many_engine(device, engine)
        ordinals = check_devices(device, "auto", devices)
        if len(ordinals) != 1:
            raise ConfigError(f"devices={devices!r}: a MultiTrainer trains on one GPU; pass 1 or [ordinal]")
        check_schedule(schedule)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")
        hparams = {"lr": lr, "weight_decay": weight_decay, **hyperparameters}
        count = model_count(models, {**hparams, "seeds": seeds})
        optimizers = per_model_optimizers(optimizer, count, hparams)
        init_seeds = per_model_seeds(seeds, count)
        self._config = ManyConfig(
            model=model,
            optimizers=tuple(optimizers),
            batch_size=integer("batch_size", batch_size, 1),
            precision=precision,
            shuffle_seed=integer("shuffle_seed", shuffle_seed, 0, 2**64),
            drop_last=bool(drop_last),
            normalize=check_normalize(normalize, model.in_features),
            loss=loss,
            tuning=check_tuning(tuning),
        )
        self._seeds = init_seeds
        self._schedule = schedule
        self._schedules = [bind(schedule, opt.lr) for opt in optimizers]
        states = [init_parameters(model, s) for s in init_seeds]
        self._engine = create_many_engine(device, engine, self._config, states, warn=self._warn,
                                          ordinal=ordinals[0])  # fmt: skip
        self._closed = False
        self._fitting = False
        self._given_weights = False  # load_state_dicts set them: predict may answer before any epoch
        self._fit_lock = threading.Lock()
        #: Epochs trained so far by each model (keys its next epoch's shuffle), (K,) int64.
        self.epochs = np.zeros(count, dtype=np.int64)
        #: Optimizer steps taken so far by each model, (K,) int64.
        self.steps = np.zeros(count, dtype=np.int64)
        #: Each model's History of every epoch it trained.
        self.histories = [History() for _ in range(count)]
        #: Which models diverged (their weights are those of their last finite epoch; later fits skip them).
        self.diverged = np.zeros(count, dtype=bool)
        #: The TrainingDiverged of each diverged model (None for the others).
        self.divergences: list[TrainingDiverged | None] = [None] * count
        #: After a fit with early stopping: each model's EarlyStopping (best_epoch, stopped_epoch, ...).
        self.early_stoppers: list[EarlyStopping | None] = [None] * count

    @staticmethod
    def _warn(message: str) -> None:
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    # ---- properties -------------------------------------------------------------------------------------------

    @property
    def models(self) -> int:
        """K, the number of models."""
        return self._config.count

    @property
    def model(self) -> MLP:
        return self._config.model

    @property
    def optimizers(self) -> list[Optimizer]:
        """Each model's optimizer (its own hyperparameters)."""
        return list(self._config.optimizers)

    @property
    def seeds(self) -> list[int]:
        """Each model's init seed."""
        return list(self._seeds)

    @property
    def device(self) -> str:
        """ "cpu" or "cuda": where training runs."""
        return self._engine.device

    @property
    def engine(self) -> str:
        """ "numpy" or "gpu": the engine that trains."""
        return self._engine.name

    @property
    def config(self) -> ManyConfig:
        return self._config

    def __repr__(self) -> str:
        c = self._config
        return (f"MultiTrainer(model={c.model!r}, models={c.count}, optimizer={type(c.optimizers[0]).__name__}, "
                f"batch_size={c.batch_size}, device={self.device!r}, engine={self.engine!r})")  # fmt: skip

    # ---- training ---------------------------------------------------------------------------------------------

    def fit(
        self,
        x: Any,
        y: Any,
        *,
        epochs: int = 1,
        masks: Any = None,
        eval_data: tuple[Any, Any] | None = None,
        eval_masks: Any = None,
        early_stopping: bool | int | EarlyStopping | None = None,
        callbacks: Sequence[Callable[[int, dict[str, Any]], Any]] | None = None,
    ) -> MultiTrainer:
        """Train every model that has not diverged up to `epochs` more epochs on (x, y); returns self.

        masks: None (every model trains on every row) or bool (K, N): model k trains on `x[masks[k]]` exactly as a
        separate fit on those rows would (its rows, in the shuffle of its rows); models with equal masks share one
        stream. eval_data = (x_eval, y_eval) is evaluated after every epoch (model k on its rows `eval_masks[k]`
        when given: its held-out fold). early_stopping (True, a patience or an `EarlyStopping`, needing eval_data)
        stops and, by default, rewinds each model on its own. A model whose loss or state becomes non-finite stops
        alone: `diverged[k]`, `divergences[k]`, its weights of its last finite epoch, and a RuntimeWarning.
        callbacks: each is called as `callback(k, record)` with model k's record of each epoch it trains; one that
        returns True stops model k alone after that epoch (its weights stay those of that epoch): a stopping rule of
        your own, per model (scikit-learn's `tol` / `n_iter_no_change` in `fastnn.sklearn`'s searches).

        Raises:
            DataError: x, y, eval_data, masks or eval_masks are malformed (the message names which), or a mask
                leaves a model no step.
            ConfigError: epochs, early_stopping or callbacks are invalid; early_stopping without eval_data;
                eval_masks without eval_data.
            FastnnError: the trainer is closed, or a fit of it is running.
        """
        self._check_open()
        with self._fit_lock:
            if self._fitting:
                raise FastnnError("MultiTrainer.fit was called while this trainer's fit is running")
            self._fitting = True
        try:
            return self._fit(x, y, epochs, masks, eval_data, eval_masks, early_stopping, callbacks)
        finally:
            self._fitting = False

    def _fit(self, x: Any, y: Any, epochs: Any, masks: Any, eval_data: Any, eval_masks: Any,
             early_stopping: Any, callbacks: Any = None) -> MultiTrainer:  # fmt: skip
        cfg, count = self._config, self._config.count
        x = self._inputs(x, "x")
        y = self._targets(y, x.shape[0], "y")
        epochs = integer("epochs", epochs, 0)
        masks = check_masks(masks, count, x.shape[0])
        eval_set = self._check_eval_data(eval_data)
        if eval_masks is not None and eval_set is None:
            raise ConfigError("eval_masks needs eval_data: pass eval_data=(x_eval, y_eval)")
        eval_masks = None if eval_set is None else check_masks(eval_masks, count, eval_set[0].shape[0], "eval_masks")
        stopper = check_early_stopping(early_stopping)
        callbacks = _check_callbacks(callbacks)
        if stopper is not None and eval_set is None:
            raise ConfigError(f"early_stopping={reprlib.repr(early_stopping)} needs validation data: pass eval_data")
        if stopper is not None and stopper.monitor == "eval_accuracy" and cfg.loss == "mse":
            raise ConfigError("early_stopping monitors 'eval_accuracy', which a regression (loss='mse') does not "
                              "have: use EarlyStopping(monitor='eval_loss')")  # fmt: skip
        group, group_rows = mask_groups(masks, count)
        rows = None if group_rows is None else [group_rows[g] for g in group]
        eval_rows = None
        if eval_masks is not None:
            eval_groups, eval_group_rows = mask_groups(eval_masks, count)
            eval_rows = [eval_group_rows[g] for g in eval_groups]  # type: ignore[index]
        sizes = [x.shape[0] if rows is None else r.size for r in (rows or [None] * count)]
        spe = np.array([steps_per_epoch(n, cfg.batch_size, cfg.drop_last) for n in sizes], dtype=np.int64)
        if (spe == 0).any():
            k = int(np.flatnonzero(spe == 0)[0])
            where = "x" if masks is None else f"masks[{k}]"
            raise DataError(f"{where} gives model {k} {sizes[k]} rows, fewer than batch_size={cfg.batch_size} with "
                            f"drop_last=True: its epochs would have no steps")  # fmt: skip
        if (self.epochs + epochs > MAX_EPOCH).any():
            raise ConfigError(f"epochs must be an integer in [0, {MAX_EPOCH - int(self.epochs.max())}], got {epochs}: "
                              f"a model counts at most 2**32 epochs")  # fmt: skip
        if (self.steps + epochs * spe > MAX_STEP).any():
            raise ConfigError(f"epochs={epochs} take a model's step counter past 2**63 - 1")
        if epochs == 0:
            return self
        stoppers: list[EarlyStopping | None] = [None] * count
        if stopper is not None:
            for k in range(count):
                stoppers[k] = copy.deepcopy(stopper)
                stoppers[k].reset()  # type: ignore[union-attr]
            self.early_stoppers = stoppers
        self._engine.set_train_data(x, y, rows)
        active = ~self.diverged
        best: list[dict[str, np.ndarray] | None] = [None] * count
        newly_diverged: list[int] = []
        for _ in range(epochs):
            if not active.any():
                break
            lrs = self._lr_tables(active, spe)
            result = self._engine.fit_epoch(active.copy(), self.epochs.copy(), self.steps.copy(), lrs, eval_set,
                                            eval_rows)  # fmt: skip
            for k in np.flatnonzero(active):
                k = int(k)
                if result.diverged[k] is not None:
                    self.diverged[k], self.divergences[k] = True, result.diverged[k]
                    active[k] = False
                    newly_diverged.append(k)
                    continue
                stats = result.stats[k]
                if stats is None:
                    raise RuntimeError(f"the engine reported nothing for model {k}")
                record = {
                    "epoch": int(self.epochs[k]) + 1,
                    "train_loss": float(stats.loss),
                    "train_accuracy": None if stats.accuracy is None else float(stats.accuracy),
                    "eval_loss": None if stats.eval_loss is None else float(stats.eval_loss),
                    "eval_accuracy": None if stats.eval_accuracy is None else float(stats.eval_accuracy),
                    "seconds": float(stats.seconds),
                }
                self.histories[k].append(record)
                self.epochs[k] += 1
                self.steps[k] += spe[k]
                s = stoppers[k]
                if s is not None:
                    improved, stop = s.update(record)
                    if improved and s.restore_best:
                        best[k] = self._engine.get_state(k)
                    if stop:
                        active[k] = False
                if callbacks and any([bool(cb(k, dict(record))) for cb in callbacks]):  # every one sees the epoch
                    active[k] = False
        for k in range(count):
            s = stoppers[k]
            if s is None or best[k] is None or self.diverged[k] and k in newly_diverged:
                continue
            if s.restore_best and s.best_epoch is not None and s.best_epoch < self.epochs[k]:
                keep = s.best_epoch  # the model's epoch number of its best epoch: its history's length up to it
                self._engine.set_state(k, best[k])  # type: ignore[arg-type]
                s.discarded = list(self.histories[k][keep:])
                back = int(self.epochs[k]) - keep
                self.histories[k] = self.histories[k][:keep]
                self.epochs[k] -= back
                self.steps[k] -= back * spe[k]
        if newly_diverged:
            shown = ", ".join(map(str, newly_diverged[:10])) + (", ..." if len(newly_diverged) > 10 else "")
            warnings.warn(f"{len(newly_diverged)} of {count} models diverged and stopped (models {shown}); "
                          f"see MultiTrainer.divergences", RuntimeWarning, stacklevel=3)  # fmt: skip
        return self

    def _lr_tables(self, active: np.ndarray, spe: np.ndarray) -> list[np.ndarray | None]:
        """Each active model's float32 rate of each step of its next epoch (None for the others):
        `schedules.lr_table` of its schedule; without a schedule the optimizer's lr (checked finite and > 0 in
        float32) at every step, the table lr_table makes of it, made directly for all models at once (lr_table's
        checks cost ~50 us a call: 50 ms an epoch at K = 1,024)."""
        if self._schedule is not None:
            return [lr_table(self._schedules[k], int(self.steps[k]), int(spe[k])) if active[k] else None
                    for k in range(self.models)]  # fmt: skip
        rates = np.array([opt.lr for opt in self._config.optimizers], dtype=np.float32)
        table = np.repeat(rates[:, None], int(spe.max()), axis=1)
        return [table[k, : spe[k]] if on else None for k, on in enumerate(active.tolist())]

    # ---- inference --------------------------------------------------------------------------------------------

    def evaluate(self, x: Any, y: Any, masks: Any = None) -> list[dict[str, float]]:
        """Each model's `Trainer.evaluate` dict on (x, y): {"loss", "accuracy"}, or {"loss", "mse", "r2"} for a
        regression; model k on rows `masks[k]` of them when masks (bool (K, N)) are given."""
        self._check_open()
        x = self._inputs(x, "x")
        y = self._targets(y, x.shape[0], "y")
        masks = check_masks(masks, self.models, x.shape[0])
        rows = None
        if masks is not None:
            group, group_rows = mask_groups(masks, self.models)
            rows = [group_rows[g] for g in group]  # type: ignore[index]
        out = []
        for loss, score in self._engine.evaluate(x, y, rows):
            if self._config.loss == "mse":
                out.append({"loss": float(loss), "mse": float(loss), "r2": float(score)})
            else:
                out.append({"loss": float(loss), "accuracy": float(score)})
        return out

    def predict_proba(self, x: Any) -> np.ndarray:
        """Each classifier's softmax probabilities, (K, N, classes) float32."""
        self._check_open()
        if self._config.loss == "mse":
            raise ConfigError("predict_proba is for classifiers; these models are regressions (loss='mse'): "
                              "use predict or forward")  # fmt: skip
        x = self._inputs(x, "x")
        self._check_weights("predict_proba")  # after the input's checks: a bad x is named first
        return self._engine.predict_proba(x)

    def forward(self, x: Any) -> np.ndarray:
        """Each model's outputs, (K, N, outputs) float32: probabilities of a classifier, values of a regression."""
        self._check_open()
        if self._config.loss != "mse":
            return self.predict_proba(x)
        x = self._inputs(x, "x")
        self._check_weights("forward")
        return self._engine.predict_outputs(x)

    def predict(self, x: Any) -> np.ndarray:
        """Each classifier's most probable class, (K, N) int64; a regression's values, (K, N, outputs) float32."""
        out = self.forward(x)
        return out.argmax(axis=2) if self._config.loss != "mse" else out

    # ---- models -----------------------------------------------------------------------------------------------

    def _index(self, k: Any) -> int:
        return integer("k", k, 0, self.models)

    def trainer(self, k: int, device: str | None = None, engine: str = "auto") -> Trainer:
        """Model k as an ordinary `Trainer` (its optimizer, state, counters and history; the shared shuffle seed as
        its seed): evaluate, predict, save it, or fit it on; a fit on goes on as its separate fit would have.
        `device` None keeps this trainer's."""
        self._check_open()
        k = self._index(k)
        c = self._config
        trainer = Trainer(c.model, c.optimizers[k], batch_size=c.batch_size, precision=c.precision,
                          device=self.device if device is None else device, seed=c.shuffle_seed,
                          schedule=self._schedule, normalize=c.normalize, drop_last=c.drop_last, engine=engine,
                          loss=c.loss)  # fmt: skip
        # The whole state, optimizer state included, so that fitting on continues model k's own run.
        trainer._engine.set_state(self._engine.get_state(k))
        trainer.epoch, trainer.step = int(self.epochs[k]), int(self.steps[k])
        trainer.history = self.histories[k][:]
        trainer._given_weights = self._given_weights
        return trainer

    def set_lr(self, k: int, lr: float) -> None:
        """Set model k's learning rate for its next epochs (a per-model rule between epochs, e.g. from a fit
        callback: `fastnn.sklearn`'s searches halve or rescale each model's rate as its own fit would); its
        optimizer (`optimizers[k]`, `trainer(k)`) takes the new lr, the others are unchanged.

        Raises:
            ConfigError: k is not a model's index, lr is not a number > 0 finite and nonzero in float32, or the
                trainer was given a `schedule` (which gives every step's rate).
        """
        self._check_open()
        k = self._index(k)
        if self._schedule is not None:
            raise ConfigError(f"set_lr({k}, {lr!r}): this MultiTrainer's schedule gives every step's rate; "
                              f"a per-model lr is set only without a schedule")  # fmt: skip
        optimizers = list(self._config.optimizers)
        try:
            optimizers[k] = dataclasses.replace(optimizers[k], lr=lr)
        except ConfigError as exc:
            raise ConfigError(f"set_lr({k}, {lr!r}): {exc}") from None
        self._config = dataclasses.replace(self._config, optimizers=tuple(optimizers))
        self._schedules[k] = bind(None, optimizers[k].lr)

    def state_dict(self, k: int) -> dict[str, np.ndarray]:
        """Model k's parameters as float32 copies, keyed like `Trainer.state_dict` (one model's of
        `state_dicts`; a fit callback may read them)."""
        self._check_open()
        k = self._index(k)
        state = self._engine.get_state(k)
        return {n: state[n] for n in param_names(self._config.model)}

    def state_dicts(self) -> list[dict[str, np.ndarray]]:
        """Each model's parameters as float32 copies, keyed like `Trainer.state_dict`."""
        self._check_open()
        names = param_names(self._config.model)
        return [{n: s[n] for n in names} for s in (self._engine.get_state(k) for k in range(self.models))]

    def load_state_dicts(self, state_dicts: Sequence[Mapping[str, Any]]) -> None:
        """Replace every model's parameters (not optimizer state) with K state dicts, all checked before any is set.

        Raises:
            DataError: not K of them, or one `Trainer.load_state_dict` would refuse (the message names which).
        """
        self._check_open()
        if self._fitting:
            raise FastnnError("MultiTrainer.load_state_dicts was called while this trainer's fit is running")
        if not isinstance(state_dicts, Sequence) or len(state_dicts) != self.models:
            got = len(state_dicts) if isinstance(state_dicts, Sequence) else reprlib.repr(state_dicts)
            raise DataError(f"state_dicts must be a sequence of {self.models} state dicts, got {got}")
        shapes = {n: (o, i) if n.endswith("weight") else (o,)
                  for (i, o), pair in zip(self._config.model.layers, _pairs(param_names(self._config.model)))
                  for n in pair}  # fmt: skip
        checked = [checked_state(s, shapes, self._config.precision, f"state_dicts[{k}]")
                   for k, s in enumerate(state_dicts)]  # fmt: skip
        for k, s in enumerate(checked):
            self._engine.set_state(k, s)
        self._given_weights = True

    def _check_weights(self, method: str) -> None:
        """NotFittedError where the weights are still the random initial ones and no fit ran (no epoch trained, no
        model diverged, none loaded), as `Trainer.predict` refuses."""
        if not self.epochs.any() and not self.diverged.any() and not self._given_weights:
            raise NotFittedError(
                f"MultiTrainer.{method}: these models have not been trained (no epoch; fit them first) nor given "
                f"weights (load_state_dicts): they would answer from their random initial weights"
            )

    def best(self, metric: str | None = None) -> int:
        """The index of the best model by the last record of its history (its current weights): smallest loss or
        largest accuracy. metric: "eval_loss", "eval_accuracy", "train_loss", "train_accuracy" ("val_loss" and
        "val_accuracy" name the eval ones); None is "eval_loss" when models were evaluated, else "train_loss".
        Models without a finite value are skipped; ties go to the lowest index.

        Raises:
            ConfigError: an unknown metric, or no model has a finite value of it.
        """
        if metric is None:
            last = [h[-1] for h in self.histories if len(h)]
            metric = "eval_loss" if any(r["eval_loss"] is not None for r in last) else "train_loss"
        name = "e" + metric if isinstance(metric, str) and metric.startswith("val_") else metric
        if name not in METRICS:
            raise ConfigError(f"metric must be one of {tuple(METRICS)} (or 'val_loss', 'val_accuracy'), got "
                              f"{metric!r}")  # fmt: skip
        values = np.array([h[-1][name] if len(h) and h[-1][name] is not None else math.nan for h in self.histories],
                          dtype=np.float64)  # fmt: skip
        ok = np.isfinite(values)
        if not ok.any():
            raise ConfigError(f"no model has a finite {name} in its last history record: fit first"
                              f"{' with eval_data' if name.startswith('eval') else ''}")  # fmt: skip
        ranked = np.where(ok, values if METRICS[name] else -values, np.inf)
        return int(np.argmin(ranked))

    # ---- checks and lifetime ----------------------------------------------------------------------------------

    def _inputs(self, x: Any, name: str) -> np.ndarray:
        cfg = self._config
        x = check_inputs(x, cfg.model.in_features, name)  # host arrays: the engines upload them (masks select rows)
        if isinstance(x, np.ndarray):  # as Trainer: the same call gives the same answer on every device
            check_operand_range(x, cfg.normalize, precision_spec(cfg.precision).operand, name,
                                f"precision={cfg.precision!r}")  # fmt: skip
        return x

    def _targets(self, y: Any, n: int, name: str) -> np.ndarray:
        if self._config.loss == "mse":
            return check_targets(y, n, self._config.model.classes, name)
        return check_labels(y, n, self._config.model.classes, name)

    def _check_eval_data(self, eval_data: Any) -> tuple[np.ndarray, np.ndarray] | None:
        if eval_data is None:
            return None
        if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
            raise DataError(f"eval_data must be a pair (x_eval, y_eval), got {reprlib.repr(eval_data)}")
        ex = self._inputs(eval_data[0], "eval_data[0]")
        return ex, self._targets(eval_data[1], ex.shape[0], "eval_data[1]")

    def close(self) -> None:
        """Release the engine's resources; the trainer is unusable afterwards."""
        if self._fitting:
            raise FastnnError("MultiTrainer.close was called while its fit is running")
        if not self._closed:
            self._closed = True
            self._engine.close()

    def __enter__(self) -> MultiTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise FastnnError("this MultiTrainer is closed")


def _check_callbacks(callbacks: Any) -> list[Callable[[int, dict[str, Any]], Any]]:
    """`fit`'s callbacks: None or a list/tuple of callables (k, record) -> True to stop model k."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)) or not all(callable(cb) for cb in callbacks):
        raise ConfigError(f"callbacks must be a list of callables (k, record) -> True to stop model k, got "
                          f"{reprlib.repr(callbacks)}")  # fmt: skip
    return list(callbacks)


def _pairs(names: list[str]) -> list[tuple[str, str]]:
    """(weight, bias) names of each layer."""
    return list(zip(names[::2], names[1::2]))
