"""`Trainer`: the user's words. It validates every argument before any work, then drives an engine.

The trainer owns the bookkeeping that outlives one `fit` call (epochs and steps done, the history);
the engine owns the parameters and optimizer state. A call that fails validation changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from ._checks import integer
from ._control import Callback, EarlyStopping
from ._data import check_normalize, check_sample_weight
from ._errors import ConfigError, DataError, FastnnError, NotFittedError
from ._fit import FitRun, check_fit, plan_run, take_part
from ._gpu_arrays import CudaArray
from ._history import History
from ._inputs import inputs, targets
from ._model import MLP, init_parameters, param_names
from ._optim import OPTIMIZERS, SGD, Optimizer
from ._saved import check_loadable, checked_progress, param_shapes, saved_config, saved_model, state_shapes
from ._state import checked_state
from ._torch import to_torch
from .engine.base import LOSSES, PRECISIONS, EngineConfig
from .engine.placement import check_placement
from .engine.select import DEVICES, EngineRefused, check_devices, check_distributed, check_engine, create_engine
from .engine.tuning import Tuning, check_tuning
from .engine.warmup import overlapped
from .schedules import Schedule, bind, check_schedule

__all__ = ["Trainer"]

def _check_device(device: Any) -> str:
    if not isinstance(device, str) or device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    return device


def _check_loss(loss: Any, model: MLP) -> str:
    """`loss` as one of LOSSES, fitting the model: a classifier needs two outputs (classes) or more."""
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ConfigError(f"loss must be one of {LOSSES}, got {loss!r}")
    if loss == "cross_entropy" and model.classes < 2:
        raise ConfigError(
            f"model sizes {list(model.sizes)} end in {model.classes} output: a classifier (loss='cross_entropy') "
            f"needs at least 2 classes; for a regression of one target pass loss='mse'"
        )
    return loss


class Trainer:
    """Trains an `MLP` with an optimizer on the CPU (NumPy) or the GPU (one CUDA graph per epoch).

    Args:
        model: the network, e.g. `MLP([784, 128, 10])`.
        optimizer: `SGD` or `AdamW`; None means `SGD(lr=0.1)`.
        batch_size: samples per step; the last short batch of an epoch is a step too unless `drop_last`.
        precision: "mixed" (fp16 operands, fp32 accumulation and weights), "fp16" or "fp32"; the CPU computes fp32.
            With "mixed" and "fp16", inputs must stay within float16's range (|x| <= 65504 after `normalize`) on
            every device, the CPU included: a DataError names the first one that does not.
        device: "cpu", "cuda", or "auto" (the GPU when usable, else the CPU with a warning).
        engine: on a GPU, "fused" (one persistent kernel per epoch, weights on chip: small models), "grid" (one
            cooperative persistent kernel per epoch over up to every SM: MLPs with hidden layers, mid and wide ones
            at small batches), "graph" (one CUDA graph of library calls per epoch: any model), or "auto" (fused
            where it holds the model and is faster, else grid likewise, else graph). Ignored on the CPU, where only
            "auto" is accepted.
        seed: keys the initial weights and every epoch's sample order; an integer in [0, 2**64).
        schedule: a callable global step -> lr (see `fastnn.schedules`); None keeps the optimizer's lr.
        normalize: None or (mean, std) applied after uint8 inputs are scaled to [0, 1]; each a number or a
            vector with one entry per input feature (the fused and grid engines take numbers only).
        drop_last: drop each epoch's last batch when it is short.
        data_placement: on a GPU, where the training set lives: "device" (GPU memory), "host" (mapped host memory,
            read over the bus by the gather: for sets larger than GPU memory; the graph engine only) or "auto"
            (the GPU while the set takes at most 80% of its free memory). Only "auto" on the CPU.
        distributed: a `fastnn.distributed.Group` (from `fastnn.distributed.init()`): train data-parallel, this
            process being one rank on one GPU (graph engine). Every rank passes the same arguments and data.
        devices: the GPUs of this process to train on: a count N (GPUs 0..N-1) or a list of ordinals, default 1.
            Several: data-parallel with a replica of the graph engine on each (NCCL, the "multi" extra), results
            as on one GPU up to summation order; one: that GPU alone (any engine).
        tuning: advanced: a `fastnn.engine.Tuning`, the engines' measured choices (benchmarks and tests compare
            variants with it); None takes the measured winners. It changes how training runs, not what it computes.
        loss: "cross_entropy" (classification: integer labels, one output per class) or "mse" (regression: float
            targets (N,) or (N, k) for a model of k outputs, the last layer linear); every engine trains both.

    Raises:
        ConfigError: an argument is invalid (the message names it), or engine="fused" or "grid" cannot serve the
            model.
        DeviceUnavailable: device="cuda" (or `devices` naming GPUs) and no usable GPU; a GPU in `devices` that the
            machine does not have; several `devices` and no NCCL (the message names the extra).
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
        normalize: tuple[Any, Any] | None = None,
        drop_last: bool = False,
        engine: str = "auto",
        data_placement: str = "auto",
        distributed: Any = None,
        devices: int | Sequence[int] = 1,
        tuning: Tuning | None = None,
        loss: str = "cross_entropy",
    ) -> None:
        if not isinstance(model, MLP):
            raise ConfigError(f"model must be a fastnn.MLP, got {reprlib.repr(model)}")
        _check_loss(loss, model)
        if optimizer is None:
            optimizer = SGD(lr=0.1)
        if not isinstance(optimizer, OPTIMIZERS):
            names = " or ".join(f"fastnn.{c.__name__}" for c in OPTIMIZERS)
            raise ConfigError(f"optimizer must be {names}, got {reprlib.repr(optimizer)}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        _check_device(device)
        check_engine(device, engine)
        check_placement(device, data_placement)
        check_distributed(device, engine, distributed)
        check_devices(device, engine, devices, distributed)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")
        self._config = EngineConfig(
            model=model,
            optimizer=optimizer,
            batch_size=integer("batch_size", batch_size, 1),
            precision=precision,
            seed=integer("seed", seed, 0, 2**64),
            drop_last=bool(drop_last),
            normalize=check_normalize(normalize, model.in_features),
            data_placement=data_placement,
            tuning=check_tuning(tuning),
            loss=loss,
        )
        self._schedule = bind(schedule, optimizer.lr)
        # On a GPU, CUDA's start (probe, context) runs on a thread meanwhile: the engine's first calls find it done.
        with overlapped(device, devices, distributed):
            state = init_parameters(model, self._config.seed)
            self._engine = create_engine(
                device, self._config, state, engine=engine, stacklevel=2, group=distributed, devices=devices
            )
        self._distributed = distributed
        self._closed = False
        self._fitting = False  # a fit is running: its callbacks may not fit, close or replace the weights
        self._fit_lock = threading.Lock()  # makes fit's check-and-set of _fitting one step: two threads can't pass
        self.epoch = 0  #: epochs trained so far, over every fit call; keys the next epoch's shuffle
        self.step = 0  #: optimizer steps taken so far; the schedule and AdamW's bias correction count these
        self._given_weights = False  # load_state_dict or load set them: predict may answer before any epoch
        self.history = History()  #: every epoch ever trained by this trainer (fit returns one call's)

    # ---- properties -------------------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """ "cpu" or "cuda": where training actually runs (what "auto" resolved to)."""
        return self._engine.device

    @property
    def engine(self) -> str:
        """ "numpy", "graph", "fused" or "grid": the engine whose kernels train (what device and engine "auto" resolved
        to). The engine is chosen once, when the trainer is made (`fastnn/engine/select.py`); a grid engine "auto" chose
        trains a set its kernels cannot serve (rows of a type they do not take, or too large for GPU memory beside
        their scratch) with the graph engine's step, and from that set's fit on says "graph"."""
        return self._engine.name

    @property
    def model(self) -> MLP:
        return self._config.model

    @property
    def optimizer(self) -> Optimizer:
        return self._config.optimizer

    @property
    def loss(self) -> str:
        """ "cross_entropy" (a classifier) or "mse" (a regression)."""
        return self._config.loss

    @property
    def config(self) -> EngineConfig:
        """The validated configuration the engine was built from."""
        return self._config

    def __repr__(self) -> str:
        c = self._config
        return (
            f"Trainer(model={c.model!r}, optimizer={c.optimizer!r}, batch_size={c.batch_size}, "
            f"precision={c.precision!r}, device={self.device!r}, engine={self.engine!r}, seed={c.seed}, "
            f"{'' if c.loss == 'cross_entropy' else f'loss={c.loss!r}, '}epoch={self.epoch})"
        )

    # ---- training ---------------------------------------------------------------------------------------------

    def fit(
        self,
        x: Any,
        y: Any,
        epochs: int = 1,
        eval_data: tuple[Any, Any] | None = None,
        eval_every: int = 1,
        progress: bool | str = "auto",
        validation_split: float | None = None,
        early_stopping: bool | int | EarlyStopping | None = None,
        callbacks: Sequence[Callback] | None = None,
        sample_weight: Any = None,
    ) -> History:
        """Train up to `epochs` more epochs on (x, y); returns this call's History (`self.history` holds all).

        x is (N, in_features) uint8 (scaled by 1/255) or float; y is (N,) integer labels, or with loss="mse"
        float targets (N,) or (N, k) (a regression's records have no accuracy: None). With eval_data
        = (x_eval, y_eval), evaluate after every `eval_every`-th epoch of this call and after its last.
        `validation_split=f` instead holds out ceil(f * N) rows of (x, y) as the eval data, chosen by
        a permutation keyed by the trainer's seed (the same rows on every engine and call).
        Epochs are numbered from 1 wherever they are shown: record["epoch"] == n is the trainer's n-th epoch,
        and `trainer.epoch` (epochs done) is n after it.

        `early_stopping` (True, a patience, or a `fastnn.EarlyStopping`) stops when the eval loss (or accuracy)
        stops improving and, by default, ends at the best epoch: weights, optimizer state, counters and history
        all go back to its end. `callbacks` are called with each epoch's record once it is recorded; one that
        returns True or raises `fastnn.StopTraining` stops training after that epoch. Both run once per epoch
        on the host; on the GPU they make the engine wait for each epoch before queuing the next (no epoch
        trains past a stop), a host round trip per epoch and never per step.

        sample_weight: None, or (N,) finite weights >= 0, not all zero: each row's loss and gradient are
        multiplied by its weight and a batch's loss is their sum over the batch's weight sum (PyTorch's weighted
        mean; `fastnn/engine/numpy_engine.py`); the history's train_loss is the weighted mean. Equal weights change
        nothing. Unequal weights train on the CPU and on the graph engine (its weighted loss kernels; one GPU,
        drop_last=False); engine="fused" or "grid" refuses them by name, and an engine="auto" trainer that chose
        either trains that fit with the graph engine's step (`Trainer.engine` then says "graph"). Not with
        validation_split.

        progress: True, False, or "auto" (on when stdout is a terminal): a line per epoch, or on the CPU with
        tqdm installed a bar per epoch that moves with every step. A stream that fails (a closed stdout, a broken
        pipe) turns the display off with one RuntimeWarning; training goes on.

        Everything is validated before any training; the schedule is evaluated for every step of a chunk
        of epochs (up to `_fit.LR_CHUNK_STEPS` steps) before that chunk trains, so a fit of 10**7 epochs starts
        at once, and a schedule failing in a later chunk raises after the chunks before it were recorded.
        A trainer counts at most 2**32 epochs.

        Interrupted (Ctrl-C, an error in a callback), the counters, history and weights
        all describe the end of the same epoch: the last one whose training finished.

        Raises:
            DataError: x, y or eval_data are malformed (the message names which), hold an input beyond float16's
                range with precision "mixed"/"fp16" or a regression target whose square float32 cannot hold
                (|y| > ~1.84e19: scale it), or validation_split leaves no row for training or validation.
            ConfigError: epochs, eval_every, progress, validation_split, early_stopping, callbacks or the
                schedule are invalid; validation_split with eval_data; early_stopping without either.
            TrainingDiverged: the loss, or the weights or optimizer state an epoch ended with, became
                non-finite; the weights and optimizer state of the last finite epoch are kept.
            FastnnError: the trainer is closed, or this fit is called while one of its own runs (from a callback or
                another thread: the second call is refused before it checks anything).
        """
        self._check_open()
        with self._fit_lock:  # checked and claimed at once, before validation: a second thread is refused by name
            self._check_not_fitting("fit", "a nested fit would train over the running one's epochs, and the "
                                    "counters and history would go backwards")  # fmt: skip
            self._fitting = True
        try:
            weight = check_sample_weight(sample_weight, x, validation_split)
            self._engine.set_sample_weight(weight)  # a GPU engine refuses unequal weights here, before any work
            try:
                return self._fit(x, y, epochs, eval_data, eval_every, progress, validation_split, early_stopping,
                                 callbacks)  # fmt: skip
            finally:
                if weight is not None:
                    self._engine.set_sample_weight(None)
        finally:
            self._fitting = False

    def _fit(
        self,
        x: Any,
        y: Any,
        epochs: int,
        eval_data: tuple[Any, Any] | None,
        eval_every: int,
        progress: bool | str,
        validation_split: float | None,
        early_stopping: bool | int | EarlyStopping | None,
        callbacks: Sequence[Callback] | None,
    ) -> History:
        """`fit`'s work, run while `fit` holds the trainer (`_fitting`): check, plan the run, drive the epochs (each
        committed to the counters and history as it ends), settle the call's history (`_fit.py`)."""
        args = check_fit(self._config, self.device == "cuda", x, y, epochs, eval_data, eval_every, progress,
                         validation_split, early_stopping, callbacks)  # fmt: skip
        plan = plan_run(args, self._config, self, self._schedule)
        if args.epochs == 0:
            if self._distributed is not None:
                take_part(plan, self._engine)
            return History()
        run = FitRun(plan, self._engine, self, self._schedule)
        run.drive()
        return run.finish()

    def _inputs(self, x: Any, name: str) -> np.ndarray | CudaArray:
        """`x` checked for this model; arrays in GPU memory are used in place only by the GPU engines."""
        return inputs(self._config, x, name, gpu=self.device == "cuda")

    def _targets(self, y: Any, n: int, name: str) -> np.ndarray:
        """`y` checked for this model and loss (labels, or regression targets)."""
        return targets(self._config, y, n, name, gpu=self.device == "cuda")

    # ---- inference --------------------------------------------------------------------------------------------

    def evaluate(self, x: Any, y: Any) -> dict[str, float]:
        """{"loss": mean cross-entropy, "accuracy": fraction correct} of the current weights on (x, y); for a
        regression (loss="mse") {"loss": mean squared error, "mse": the same, "r2": R^2 averaged over the
        outputs (1 is perfect, 0 is predicting each target's mean, and worse is negative)}."""
        self._check_open()
        x = self._inputs(x, "x")
        y = self._targets(y, x.shape[0], "y")
        loss, score = self._engine.evaluate(x, y)
        if self._config.loss == "mse":
            return {"loss": float(loss), "mse": float(loss), "r2": float(score)}
        return {"loss": float(loss), "accuracy": float(score)}

    def predict_proba(self, x: Any) -> np.ndarray:
        """Softmax class probabilities, (N, classes) float32.

        Raises:
            ConfigError: the trainer is a regression (loss="mse"): it has `predict` only.
        """
        self._check_open()
        if self._config.loss == "mse":
            raise ConfigError("predict_proba is for classifiers; this trainer is a regression (loss='mse'): "
                              "use predict")  # fmt: skip
        x = self._inputs(x, "x")
        self._check_weights("predict_proba")  # after the input's checks: a bad x is named first
        return self._engine.predict_proba(x)

    def predict(self, x: Any) -> np.ndarray:
        """The most probable class of each row, (N,) int64; for a regression (loss="mse") the predicted values,
        (N, k) float32, or (N,) when the model has one output."""
        if self._config.loss != "mse":
            return self.predict_proba(x).argmax(axis=1)
        self._check_open()
        x = self._inputs(x, "x")
        self._check_weights("predict")
        out = self._engine.predict_outputs(x)
        return out[:, 0] if out.shape[1] == 1 else out

    # ---- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """float32 copies of the parameters keyed like torch.nn.Sequential: "0.weight" (out, in), "0.bias", ..."""
        self._check_open()
        state = self._engine.get_state()
        return {n: state[n] for n in param_names(self._config.model)}

    def to_torch(self) -> Any:
        """The network as a float32 `torch.nn.Sequential` (Linear, ReLU or GELU(tanh), ..., Linear) on the CPU.

        Raises:
            ImportError: PyTorch is not installed.
        """
        return to_torch(self._config.model, self.state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the parameters (not the optimizer state) with `state_dict`'s, checked against the model.

        Raises:
            DataError: a name is missing or unexpected, or an array has the wrong shape or values that are not
                finite in float32 (or, with precision "fp16"/"mixed", in float16).
            FastnnError: called while this trainer's fit runs (from a callback).
        """
        self._check_open()
        self._check_not_fitting("load_state_dict", "the running fit would go on from weights it did not train")
        shapes = param_shapes(self._config.model)
        self._engine.set_state(checked_state(state_dict, shapes, self._config.precision, "state_dict"))
        self._given_weights = True

    def save(self, path: str | os.PathLike[str] | BinaryIO) -> None:
        """Write config, epoch/step counters, history, parameters and optimizer state to an .npz, atomically.

        `path` is a file name, or a binary file object to write into (io.BytesIO: a checkpoint in memory). The
        file keeps the last 100,000 epochs of the history (`fastnn._history.SAVED_RECORDS`): a trainer fitted in
        many small calls would otherwise write a file without bound; `self.history` keeps them all.

        What is written passes the checks `load` applies (the same functions) first: a state `load` would
        refuse is not written, and a file already at `path` is left as it was.

        Raises:
            DataError: the state, counters or history would not load (the message says which and why).
        """
        self._check_open()
        c = self._config
        config = saved_config(c, self.epoch, self.step, self.history)
        state = self._engine.get_state()
        try:
            check_loadable(config, state, c)
        except (DataError, ValueError) as exc:
            raise DataError(
                f"not saving checkpoint {str(path)!r}: {exc}; load would refuse it (nothing was written)"
            ) from exc
        from . import _checkpoint  # zipfile and the file helpers: imported by the first save or load

        _checkpoint.save(path, config, state)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | BinaryIO,
        device: str = "auto",
        schedule: Schedule | None = None,
        engine: str = "auto",
        data_placement: str = "auto",
        distributed: Any = None,
        devices: int | Sequence[int] = 1,
        tuning: Tuning | None = None,
        batch_size: int | None = None,
    ) -> Trainer:
        """A trainer restored from `save`'s file (or a binary file object holding it), ready to continue exactly
        where it stopped.

        A schedule is code and is not saved: pass the same `schedule` again to continue with it; the same for
        `tuning` (see `Trainer`). `batch_size` (None: the file's) continues with another batch size: the weights,
        optimizer state and counters carry over, later epochs take the steps of the new size.

        Raises:
            DataError: the file is missing, not a fastnn checkpoint, from a newer format, or inconsistent.
        """
        from . import _checkpoint

        # The arrays' names and shapes follow from the config: checked from the headers before any data is read.
        config, arrays = _checkpoint.load(path, expect=lambda cfg: state_shapes(*saved_model(cfg)))
        where = f"checkpoint {str(path)!r}"
        _check_device(device)  # the caller's arguments, not the file's: these stay ConfigErrors
        check_engine(device, engine)
        check_placement(device, data_placement)
        check_distributed(device, engine, distributed)
        check_devices(device, engine, devices, distributed)
        check_schedule(schedule)
        check_tuning(tuning)
        if batch_size is not None:
            batch_size = integer("batch_size", batch_size, 1)
        try:
            model, optimizer = saved_model(config)
            kwargs = {k: config[k] for k in ("batch_size", "precision", "seed", "normalize", "drop_last")}
            if batch_size is not None:
                kwargs["batch_size"] = batch_size
            kwargs["loss"] = config.get("loss", "cross_entropy")  # files written before regression: classifiers
            if not isinstance(kwargs["precision"], str) or kwargs["precision"] not in PRECISIONS:
                raise ConfigError(f"precision must be one of {PRECISIONS}, got {kwargs['precision']!r}")
            epoch, step, history = checked_progress(config)
            # Before the engine is built: no work on a bad file. The same checks as `save`'s.
            state = checked_state(arrays, state_shapes(model, optimizer), kwargs["precision"], where)
            trainer = cls(
                model, optimizer, device=device, schedule=schedule, engine=engine, data_placement=data_placement,
                distributed=distributed, devices=devices, tuning=tuning, **kwargs
            )
        except (DataError, EngineRefused):
            raise  # already names the file and the array, or the caller's engine choice
        except KeyError as exc:
            raise DataError(f"{where} holds an invalid config: no entry {exc}") from exc
        except (TypeError, ValueError) as exc:  # ConfigError is a ValueError: a bad value in the saved config
            raise DataError(f"{where} holds an invalid config: {exc}") from exc
        except OverflowError as exc:  # JSON holds ints of any size; a check that takes one as a float overflows
            raise DataError(f"{where} holds an invalid config: a number too large for a float ({exc})") from exc
        try:
            trainer._engine.set_state(state)
            trainer._given_weights = True
        except BaseException:
            trainer.close()
            raise
        trainer.epoch, trainer.step, trainer.history = epoch, step, history
        return trainer

    def _continued(
        self, schedule: Schedule | None, batch_size: int | None = None, weight_decay: float | None = None
    ) -> Trainer:
        """A new trainer on this one's device and engine that continues it exactly (weights, optimizer state,
        counters, history) with another batch size or weight decay; this one stays open. fastnn.sklearn's
        partial_fit changes both between calls: in memory, without a checkpoint's serialisation and checks.

        Raises:
            ConfigError: batch_size or weight_decay is invalid (named); FastnnError: the trainer is closed or
                distributed.
        """
        self._check_open()
        if self._distributed is not None:
            raise FastnnError("a distributed trainer continues through save and load on every rank")
        c = self._config
        optimizer = c.optimizer if weight_decay is None else dataclasses.replace(c.optimizer, weight_decay=weight_decay)
        new = Trainer(
            c.model, optimizer, batch_size=c.batch_size if batch_size is None else batch_size, precision=c.precision,
            device=self.device, seed=c.seed, schedule=schedule, normalize=c.normalize, drop_last=c.drop_last,
            engine=self.engine if self.device == "cuda" else "auto", data_placement=c.data_placement,
            tuning=c.tuning, loss=c.loss,
        )  # fmt: skip
        try:
            new._engine.set_state(self._engine.get_state())
        except BaseException:
            new.close()
            raise
        new.epoch, new.step, new.history = self.epoch, self.step, self.history  # moves on: this one is done
        new._given_weights = self._given_weights
        return new

    # ---- lifetime ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine's resources (GPU memory, graphs); the trainer is unusable afterwards.

        Raises:
            FastnnError: called while this trainer's fit runs (from a callback): the engine is in use.
        """
        self._check_not_fitting("close", "its engine is training; return True from the callback (or raise "
                                "fastnn.StopTraining) to stop the fit, then close")  # fmt: skip
        if not self._closed:
            self._closed = True
            self._engine.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_weights(self, method: str) -> None:
        """NotFittedError where the weights are still the random initial ones (no epoch trained, none loaded)."""
        if self.epoch == 0 and not self._given_weights:
            raise NotFittedError(
                f"Trainer.{method}: this trainer has not been trained (no epoch; fit it first) nor given weights "
                f"(load_state_dict or Trainer.load): it would answer from its random initial weights"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise FastnnError("this Trainer is closed")

    def _check_not_fitting(self, method: str, why: str) -> None:
        """Refuse `method` while a fit of this trainer runs (called from one of its callbacks, or a thread)."""
        if self._fitting:
            raise FastnnError(f"Trainer.{method} was called while this trainer's fit is running (from a callback or "
                              f"another thread?): {why}; call it after fit returns")  # fmt: skip

