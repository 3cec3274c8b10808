"""The NumPy engine (`device="cpu"`): the definition of correct that the CUDA engine must match.

Forward is `x @ W.T + b` per layer with the activation after every layer but the last; the loss is
softmax cross-entropy, mean over the batch (`loss_and_grad`), or for a regression (loss "mse") the squared
error, mean over the batch and the outputs (`mse_loss_and_grad`), with R^2 as `r2_score` defines it; the losses
are fastnn/_loss.py's (re-exported here), beside their description. The pieces (`forward`, the losses,
`backward`) are module functions so GPU tests can call them as the reference, in float64 where they need to.

With per-row weights (`set_sample_weight`, `Trainer.fit(sample_weight=...)`), each row's loss and gradient are
multiplied by its weight and the batch's loss is their sum over the sum of the batch's weights (_loss.weighted):
PyTorch's weighted mean (`CrossEntropyLoss(weight=..., reduction="mean")`), scikit-learn's `np.average(loss,
weights=sample_weight)` per batch. A batch whose weights are all zero takes no step. The epoch's loss is the
weighted mean over its rows; its accuracy stays the fraction of rows right.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._data import input_affine, prepare_batch
from .._errors import TrainingDiverged
from .._loss import describe, log_softmax, loss_and_grad, mse_loss_and_grad, weighted
from .._model import MLP, param_names
from .._optim import AdamW, adamw_step, sgd_step
from .._shuffle import permutation
from .._state import state_problem
from .base import Engine, EngineConfig, EpochStats, OnEpoch, batch_slices, steps_per_epoch
from .cpu_threads import blas_threads, limited_blas

__all__ = [
    "Cache",
    "NumpyEngine",
    "activation",
    "activation_grad",
    "backward",
    "forward",
    "log_softmax",
    "loss_and_grad",
    "mse_loss_and_grad",
    "weighted",
    "r2_score",
    "softmax",
]

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715
#: Rows per chunk in evaluate/predict: bounds the (rows, widest layer) temporaries to a few MiB.
_EVAL_ROWS = 4096


def activation(z: np.ndarray, name: str) -> np.ndarray:
    """relu, or gelu in its tanh form 0.5*z*(1+tanh(sqrt(2/pi)*(z+0.044715*z**3)))."""
    if name == "relu":
        return np.maximum(z, 0)
    if name == "gelu":
        return 0.5 * z * (1.0 + np.tanh(_GELU_C * (z + _GELU_K * z**3)))
    raise ValueError(f"unknown activation {name!r}")


def activation_grad(z: np.ndarray, name: str) -> np.ndarray:
    """d activation(z) / dz, elementwise."""
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "gelu":
        t = np.tanh(_GELU_C * (z + _GELU_K * z**3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_K * z * z)
    raise ValueError(f"unknown activation {name!r}")


@dataclass
class Cache:
    """What backward needs from forward: each layer's input and each hidden layer's pre-activation."""

    inputs: list[np.ndarray]
    preacts: list[np.ndarray]


def forward(params: dict[str, np.ndarray], x: np.ndarray, model: MLP) -> tuple[np.ndarray, Cache]:
    """Logits (B, classes) of x (B, in_features) already scaled; the dtype follows x and params."""
    names = param_names(model)
    cache = Cache(inputs=[], preacts=[])
    a = x
    last = len(model.layers) - 1
    for i in range(len(model.layers)):
        w, b = params[names[2 * i]], params[names[2 * i + 1]]
        cache.inputs.append(a)
        z = a @ w.T + b
        if i == last:
            return z, cache
        cache.preacts.append(z)
        a = activation(z, model.activation)
    raise AssertionError("unreachable: a model has at least one layer")


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax probabilities."""
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def r2_score(sse: np.ndarray, y: np.ndarray) -> float:
    """R^2 of predictions whose per-output sums of squared errors are `sse` (k,), for targets y (N, k): the mean
    over the outputs of 1 - sse / sum((y - mean y)**2), an output with constant targets counting 1 when predicted
    exactly and 0 otherwise (scikit-learn's r2_score with its defaults)."""
    y64 = y.astype(np.float64)
    total = ((y64 - y64.mean(axis=0)) ** 2).sum(axis=0)
    sse = np.asarray(sse, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_output = np.where(total > 0, 1.0 - sse / np.where(total > 0, total, 1.0), np.where(sse == 0, 1.0, 0.0))
    return float(per_output.mean())


def backward(params: dict[str, np.ndarray], cache: Cache, dlogits: np.ndarray, model: MLP) -> dict[str, np.ndarray]:
    """Gradients of the loss whose d/d logits is `dlogits`, keyed like params ("0.weight", ...)."""
    names = param_names(model)
    grads: dict[str, np.ndarray] = {}
    dz = dlogits
    for i in range(len(model.layers) - 1, -1, -1):
        w = params[names[2 * i]]
        grads[names[2 * i]] = dz.T @ cache.inputs[i]
        grads[names[2 * i + 1]] = dz.sum(axis=0)
        if i == 0:
            break  # no gradient with respect to the inputs is needed
        dz = (dz @ w) * activation_grad(cache.preacts[i - 1], model.activation)
    return grads


class NumpyEngine(Engine):
    """Trains on the CPU with NumPy, float32 by default (`dtype=np.float64` for gradient checks)."""

    device = "cpu"
    name = "numpy"

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], dtype: type = np.float32) -> None:
        self.config = config
        self.dtype = dtype
        self._names = param_names(config.model)
        self.params: dict[str, np.ndarray] = {n: np.array(state[n], dtype=dtype) for n in self._names}
        self.opt_state: dict[str, dict[str, np.ndarray]] = {
            n: {s: np.zeros_like(self.params[n]) for s in config.optimizer.state_names} for n in self._names
        }
        self.set_state({k: v for k, v in state.items() if k.startswith("opt.")})
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        self._weight: np.ndarray | None = None
        self._threads = blas_threads(config.model, max(config.batch_size, _EVAL_ROWS))  # see cpu_threads

    def set_train_data(self, x: np.ndarray, y: np.ndarray) -> None:
        self._x, self._y = x, y

    def _batch(self, x: np.ndarray) -> np.ndarray:
        scale, shift = input_affine(x.dtype, self.config.normalize)
        return prepare_batch(x, scale, shift, self.dtype)

    def set_sample_weight(self, weight: np.ndarray | None) -> None:
        self._weight = None if weight is None else np.asarray(weight, dtype=self.dtype)

    def _step(self, xb: np.ndarray, yb: np.ndarray, lr: float, t: int,
              wb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """One forward/backward/update; returns each sample's loss (times its weight `wb`, if given) and
        correctness (None for a regression) before the update."""
        model, opt = self.config.model, self.config.optimizer
        logits, cache = forward(self.params, xb, model)
        labels = describe(self.config.loss).labels
        losses, dlogits = loss_and_grad(logits, yb) if labels else mse_loss_and_grad(logits, yb)
        if wb is not None:
            losses, dlogits = weighted(losses, dlogits, wb)
        grads = backward(self.params, cache, dlogits, model)
        for n in self._names:
            is_bias = n.endswith(".bias")  # decayed by the optimizer's bias_decay (fastnn/_optim.py)
            if isinstance(opt, AdamW):
                adamw_step(opt, self.params[n], grads[n], self.opt_state[n], lr, t, is_bias)
            else:
                sgd_step(opt, self.params[n], grads[n], self.opt_state[n], lr, is_bias)
        return losses, logits.argmax(axis=1) == yb if labels else None

    def fit_epochs(
        self,
        first_epoch: int,
        first_step: int,
        lrs: np.ndarray,
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_after: frozenset[int],
        on_epoch: OnEpoch,
        stoppable: bool = False,
        on_step: Callable[[], None] | None = None,
        end_epoch: int | None = None,
    ) -> None:
        with limited_blas(self._threads):  # one BLAS thread on small products (cpu_threads says why)
            self._fit_epochs(first_epoch, first_step, lrs, eval_data, eval_after, on_epoch, on_step)

    def _fit_epochs(
        self,
        first_epoch: int,
        first_step: int,
        lrs: np.ndarray,
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_after: frozenset[int],
        on_epoch: OnEpoch,
        on_step: Callable[[], None] | None,
    ) -> None:
        # Steps run one by one from here, so no epoch ever runs ahead of the one reported: always stoppable.
        if self._x is None or self._y is None:
            raise RuntimeError("set_train_data must be called before fit_epochs")
        x, y, cfg = self._x, self._y, self.config
        n = x.shape[0]
        slices = batch_slices(n, cfg.batch_size, cfg.drop_last)
        spe = steps_per_epoch(n, cfg.batch_size, cfg.drop_last)
        epochs = len(lrs) // spe if spe else 0
        step = 0
        self.last_reported = None
        for k in range(epochs):
            epoch = first_epoch + k
            start = time.perf_counter()
            snapshot = self._snapshot()
            order = permutation(cfg.seed, epoch, n)
            loss_sum, correct, seen, weight_sum = 0.0, 0, 0, 0.0
            stats = None
            try:
                # A diverging run overflows float32; the checks below report that, so the warnings are noise.
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    for lo, hi in slices:
                        idx = order[lo:hi]
                        lr, t = float(lrs[step]), first_step + step + 1
                        wb = None if self._weight is None else self._weight[idx]
                        losses, ok = self._step(self._batch(x[idx]), y[idx], lr, t, wb)
                        weight_sum += hi - lo if wb is None else float(wb.sum(dtype=np.float64))
                        step += 1
                        loss_sum += float(losses.sum(dtype=np.float64))
                        correct += 0 if ok is None else int(ok.sum())
                        seen += hi - lo
                        if on_step is not None:
                            on_step()
                        if not math.isfinite(loss_sum):
                            break  # the epoch's mean is already non-finite
                loss = loss_sum / weight_sum if weight_sum > 0 else 0.0  # the weighted mean (unweighted: each 1)
                # The loss is measured before each update: the epoch's last update is judged by the state it left.
                bad_state = None if not math.isfinite(loss) else state_problem(self._state_view(), cfg.precision)
                if not math.isfinite(loss) or bad_state is not None:
                    self.set_state(snapshot)  # keep the last finite epoch's weights and optimizer state
                    raise TrainingDiverged(epoch + 1, loss, bad_state)  # people's number of the epoch
                seconds = time.perf_counter() - start
                # From here the epoch's training is done: an interrupt reports it (below) instead of undoing it.
                labels = describe(cfg.loss).labels
                accuracy = correct / seen if labels else None
                stats = EpochStats(epoch=epoch, loss=loss, accuracy=accuracy, samples=seen, seconds=seconds)
                if k in eval_after and eval_data is not None:
                    eval_loss, eval_accuracy = self.evaluate(*eval_data)
                    if not labels:
                        eval_accuracy = None  # evaluate's second number is R^2 here; the history has no accuracy
                    stats = dataclasses.replace(stats, eval_loss=eval_loss, eval_accuracy=eval_accuracy)
                self.report(stats, on_epoch)
            except TrainingDiverged:
                raise
            except BaseException:
                if stats is None:
                    self.set_state(snapshot)  # an interrupted epoch leaves the weights of the last whole one
                elif self.last_reported is not stats:
                    self.report(stats, on_epoch, quiet=True)  # trained, but interrupted before it was reported
                raise

    def _logits_chunks(self, x: np.ndarray):
        """(first row, float64 outputs) of x in chunks. Evaluation and prediction compute in float64 from the
        float32 weights: a row's outputs then do not depend on how many rows go through at once (float32 BLAS
        sums in an order that depends on the shape, which moves the last bit), as scikit-learn's checks expect."""
        scale, shift = input_affine(x.dtype, self.config.normalize)
        params = {n: p.astype(np.float64) for n, p in self.params.items()}
        for lo in range(0, x.shape[0], _EVAL_ROWS):
            with limited_blas(self._threads):
                out = forward(params, prepare_batch(x[lo : lo + _EVAL_ROWS], scale, shift, np.float64),
                              self.config.model)[0]  # fmt: skip
            yield lo, out

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        if not describe(self.config.loss).labels:
            sse = np.zeros(y.shape[1], dtype=np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                for lo, outputs in self._logits_chunks(x):
                    diff = outputs - y[lo : lo + outputs.shape[0]]  # float64 (see _logits_chunks)
                    sse += (diff * diff).sum(axis=0)
            return float(sse.sum() / y.size), r2_score(sse, y)
        loss_sum, correct = 0.0, 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for lo, logits in self._logits_chunks(x):
                yb = y[lo : lo + logits.shape[0]]
                losses, _ = loss_and_grad(logits, yb)
                loss_sum += float(losses.sum(dtype=np.float64))
                correct += int((logits.argmax(axis=1) == yb).sum())
        return loss_sum / x.shape[0], correct / x.shape[0]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.config.model.classes), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for lo, logits in self._logits_chunks(x):
                out[lo : lo + logits.shape[0]] = softmax(logits)
        return out

    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.config.model.classes), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for lo, outputs in self._logits_chunks(x):
                out[lo : lo + outputs.shape[0]] = outputs
        return out

    def get_state(self) -> dict[str, np.ndarray]:
        state = {n: self.params[n].astype(np.float32) for n in self._names}
        for n in self._names:
            for s, arr in self.opt_state[n].items():
                state[f"opt.{s}.{n}"] = arr.astype(np.float32)
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for key, value in state.items():
            if key.startswith("opt."):
                s, n = key[4:].split(".", 1)
                self.opt_state[n][s][...] = value
            else:
                self.params[key][...] = value

    def _state_view(self) -> dict[str, np.ndarray]:
        """The live parameters and optimizer state under `get_state`'s names, without copies."""
        view = dict(self.params)
        for n in self._names:
            for s, arr in self.opt_state[n].items():
                view[f"opt.{s}.{n}"] = arr
        return view

    def _snapshot(self) -> dict[str, np.ndarray]:
        snap = {n: p.copy() for n, p in self.params.items()}
        for n in self._names:
            for s, arr in self.opt_state[n].items():
                snap[f"opt.{s}.{n}"] = arr.copy()
        return snap
