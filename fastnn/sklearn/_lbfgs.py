"""scikit-learn's lbfgs solve of `LogisticRegression`'s objective on the CPU: scipy's L-BFGS-B, full batch, float64,
called with the options scikit-learn's `_logistic_regression_path` passes, for exact parity with its fits."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["lbfgs_solve", "loss_grad"]


def loss_grad(params: np.ndarray, X: np.ndarray, y: np.ndarray, w: np.ndarray | None, l2: float, n_classes: int
              ) -> tuple[float, np.ndarray]:  # fmt: skip
    """scikit-learn's lbfgs objective and its gradient at `params` (rows of [coef | intercept], raveled): the mean
    log-loss weighted by `w` plus l2 ||coef||^2 / 2 (the intercept unpenalised); binomial on one row for two classes,
    as scikit-learn's, else multinomial. With l2 = 1 / (C * the weights' sum), this is `objective()`'s value."""
    rows = 1 if n_classes == 2 else n_classes
    P = params.reshape((rows, X.shape[1] + 1), order="F")  # feature-major, as scikit-learn's: the same iterates
    coef, intercept = P[:, :-1], P[:, -1]
    z = X @ coef.T + intercept
    s = np.full(X.shape[0], 1.0 / X.shape[0]) if w is None else w / w.sum()
    if rows == 1:
        z, t = z[:, 0], (y == 1).astype(np.float64)
        loss = np.logaddexp(0.0, z) - t * z  # log(1 + e^z) - t z
        g = (s * (1.0 / (1.0 + np.exp(-z)) - t))[:, None]
    else:
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        norm = e.sum(axis=1)
        loss = np.log(norm) - z[np.arange(len(y)), y]
        g = e / norm[:, None]
        g[np.arange(len(y)), y] -= 1.0
        g *= s[:, None]
    value = float(s @ loss) + 0.5 * l2 * float((coef**2).sum())
    grad = np.concatenate([g.T @ X + l2 * coef, g.sum(axis=0)[:, None]], axis=1)
    return value, grad.ravel(order="F")


def lbfgs_solve(X: np.ndarray, y: np.ndarray, w: np.ndarray | None, l2: float, n_classes: int, start: np.ndarray,
                max_iter: int, tol: float) -> tuple[np.ndarray, Any, list[float]]:  # fmt: skip
    """Minimise `loss_grad` from `start` ((rows, n_features + 1) [coef | intercept]) with L-BFGS-B as scikit-learn
    does: maxiter=max_iter, gtol=tol, maxls=50, ftol=64 eps. Returns (the solution, scipy's result, the objective
    after each iteration)."""
    from scipy import optimize

    X = np.ascontiguousarray(X, dtype=np.float64)
    w = None if w is None else np.asarray(w, np.float64)
    curve: list[float] = []
    result = optimize.minimize(
        loss_grad,
        np.asarray(start, np.float64).ravel(order="F"),
        method="L-BFGS-B",
        jac=True,
        args=(X, y, w, l2, n_classes),
        options={"maxiter": int(max_iter), "maxls": 50, "gtol": float(tol), "ftol": 64 * np.finfo(float).eps},
        callback=lambda intermediate_result: curve.append(float(intermediate_result.fun)),
    )
    return result.x.reshape(np.shape(start), order="F"), result, curve
