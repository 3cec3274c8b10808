"""Loss descriptions and their one NumPy definition (the NumPy engine's, which every GPU engine must match).

`native/loss.cuh` is the same per-row arithmetic on the GPU (every kernel's loss calls it), numbered by the same
kinds; tests/test_loss_kernel.py compiles that header for the CPU and compares it with the functions here. An engine
asks a `Loss` what it needs (`describe(config.loss)`): whether targets are int labels (with an accuracy) or floats,
how many 32-bit words a sample's target takes, whether the outputs pass a softmax. Adding a loss: its kind and
functions here and in native/loss.cuh, its description in LOSSES' table; each kernel plan refuses by name a kind its
kernel does not compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "KIND_HUBER", "KIND_MSE", "KIND_WXENT", "KIND_XENT", "LOSSES", "Loss", "describe", "huber_loss_and_grad",
    "log_softmax", "loss_and_grad", "mse_loss_and_grad", "weighted", "weighted_loss_and_grad",
]  # fmt: skip

#: Loss kinds as the kernels number them (native/loss.cuh's LOSS_XENT, LOSS_MSE, LOSS_WXENT, LOSS_HUBER).
KIND_XENT = 0
KIND_MSE = 1
KIND_WXENT = 2
KIND_HUBER = 3


@dataclass(frozen=True)
class Loss:
    """What an engine needs to know of a loss, in its own words (never the loss's name)."""

    name: str  #: the Trainer's word for it (`Trainer(loss=...)`)
    kind: int  #: native/loss.cuh's LOSS_ number
    labels: bool  #: targets are int32 class labels (one a sample) and the history counts correct predictions
    softmax: bool  #: the outputs pass a softmax: predict_proba's probabilities (else the outputs are the predictions)

    def target_words(self, outputs: int) -> int:
        """32-bit words of one sample's target as uploaded and gathered: an int32 label, or `outputs` float32s."""
        return 1 if self.labels else outputs


#: The losses a Trainer accepts, by name: softmax cross-entropy over int labels (classification) and the squared
#: error over float targets (regression). LOSS_WXENT and LOSS_HUBER are defined (native/loss.cuh and below) for the
#: features that will name them (sample and class weights; a robust regression), not yet a Trainer's word.
LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss("cross_entropy", KIND_XENT, labels=True, softmax=True),
    "mse": Loss("mse", KIND_MSE, labels=False, softmax=False),
}


def describe(name: str) -> Loss:
    """The description of loss `name` (one of LOSSES; the Trainer checked it)."""
    return LOSSES[name]


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log softmax, shifted by the row max for stability."""
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def loss_and_grad(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample cross-entropy losses (B,) and d(mean loss)/d logits (B, classes) (LOSS_XENT)."""
    logp = log_softmax(logits)
    rows = np.arange(logits.shape[0])
    losses = -logp[rows, y]
    dlogits = np.exp(logp)
    dlogits[rows, y] -= 1.0
    dlogits /= logits.shape[0]
    return losses, dlogits


def weighted(losses: np.ndarray, dgrad: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Any loss weighted per row: (w * losses, the gradient of sum(w * loss) / sum(w)) from its per-row `losses`
    and d(mean loss)/d outputs `dgrad`, each row's gradient times B * w / sum(w); a batch of no weight takes no
    step (zero gradient). The one definition of sample weights (Trainer.fit(sample_weight=...))."""
    w = np.asarray(w, dtype=dgrad.dtype)
    total = float(w.sum(dtype=np.float64))
    scale = w * (len(w) / total) if total > 0 else np.zeros_like(w)
    return losses * w, dgrad * scale[:, None]


def weighted_loss_and_grad(logits: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample weighted cross-entropy losses w * loss (B,) and d(batch loss)/d logits (B, classes), the batch's
    loss being sum(w * loss) / sum(w), a weighted mean as scikit-learn's sample_weight averages (LOSS_WXENT)."""
    return weighted(*loss_and_grad(logits, y), w)


def mse_loss_and_grad(outputs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample squared errors averaged over the k outputs (B,), and d(mean loss)/d outputs (B, k) (LOSS_MSE).

    The batch's loss is the mean over all B * k entries of (output - y)**2: no factor 1/2, so the loss reported
    is the mean squared error itself (scikit-learn's MLPRegressor reports half of it)."""
    diff = outputs - y
    return (diff * diff).mean(axis=1), diff * np.asarray(2.0 / diff.size, diff.dtype)


def huber_loss_and_grad(outputs: np.ndarray, y: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample Huber losses averaged over the k outputs (B,), and d(mean loss)/d outputs (B, k) (LOSS_HUBER):
    0.5 d**2 where |d| <= delta, else delta * (|d| - delta / 2), for d = output - y."""
    d = outputs - y
    a = np.abs(d)
    elem = np.where(a <= delta, 0.5 * d * d, delta * (a - 0.5 * delta))
    return elem.mean(axis=1), np.clip(d, -delta, delta) * np.asarray(1.0 / d.size, d.dtype)
