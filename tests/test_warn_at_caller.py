"""fastnn's warnings name the user's line, whichever path raised them (issue 43: the CPU fallback raised inside
fastnn.sklearn's fit pointed at fastnn/sklearn/_base.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fastnn import _warn
from fastnn.engine import select


def test_a_warning_from_inside_fastnn_names_this_file():
    with pytest.warns(UserWarning, match="hello") as seen:
        _warn.warn_at_caller("hello")
    assert seen[0].filename == __file__


def test_the_cpu_fallback_inside_an_estimators_fit_names_the_callers_line(monkeypatch):
    pytest.importorskip("sklearn")
    from fastnn.sklearn import MLPClassifier

    def no_gpu(*args, **kwargs):
        raise select.DeviceUnavailable("no usable GPU (test)")

    monkeypatch.setattr(select, "_warned", set())
    monkeypatch.setattr(select, "_gpu_engine", no_gpu)
    rng = np.random.default_rng(0)
    x, y = rng.random((60, 4)), np.arange(60) % 2
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        MLPClassifier((4,), max_iter=1, device="auto").fit(x, y)
    fallback = [w for w in seen if "training on the CPU" in str(w.message)]
    assert fallback and fallback[0].filename == __file__, [(w.filename, str(w.message)) for w in seen]
    converge = [w for w in seen if "without convergence" in str(w.message)]
    assert converge and converge[0].filename == __file__


def test_history_plot_without_matplotlib_names_the_extra(monkeypatch):
    """History.plot's ImportError says which extra installs matplotlib (issue 43)."""
    import builtins

    import fastnn

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    record = {"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5, "eval_loss": None, "eval_accuracy": None,
              "seconds": 0.1}
    history = fastnn.History([record])
    for path in (None, "curves.png"):
        with pytest.raises(ImportError, match=r'History.plot needs matplotlib: pip install -e "\.\[plot\]"'):
            history.plot(path)
