"""Numbers a float cannot hold, and Fractions: every argument that is a number goes through
fastnn._checks, so `10**400` or `Fraction(1, 100)` gives a ConfigError naming the argument and the value (a
DataError naming the file when it comes from a checkpoint), never a raw OverflowError or TypeError."""

from __future__ import annotations

import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from fastnn import MLP, SGD, AdamW, ConfigError, DataError, EarlyStopping, Trainer
from fastnn._checks import integer, number, shown
from fastnn.schedules import Cosine, StepDecay

BIG = 10**400
SHOWN_BIG = "10**400"  # how messages quote it: "an integer of about 401 digits (10**400)"
D, C = 4, 3


def _xy(n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, D)).astype(np.float32), rng.integers(0, C, n)


def _fit(**kw: object) -> Callable[[], object]:
    return lambda: Trainer(MLP([D, C]), device="cpu").fit(*_xy(), **kw)


TOO_BIG = {  # each raised a raw OverflowError before
    "SGD lr": (lambda: SGD(lr=BIG), "lr"),
    "SGD lr negative": (lambda: SGD(lr=-BIG), "lr"),
    "SGD momentum": (lambda: SGD(momentum=BIG), "momentum"),
    "SGD weight_decay": (lambda: SGD(weight_decay=BIG), "weight_decay"),
    "AdamW eps": (lambda: AdamW(eps=BIG), "eps"),
    "AdamW betas": (lambda: AdamW(betas=(0.9, BIG)), "betas[1]"),
    "MLP hidden size": (lambda: MLP([D, BIG, C]), "sizes[1]"),
    "MLP input size": (lambda: MLP([BIG, C]), "sizes[0]"),
    "EarlyStopping min_delta": (lambda: EarlyStopping(min_delta=BIG), "min_delta"),
    "fit validation_split": (_fit(validation_split=BIG), "validation_split"),
    "StepDecay gamma": (lambda: StepDecay(step_size=10, gamma=BIG), "gamma"),
    "Cosine min_lr": (lambda: Cosine(total_steps=10, min_lr=BIG), "min_lr"),
    "normalize mean": (lambda: Trainer(MLP([D, C]), device="cpu", normalize=(BIG, 1.0)), "normalize mean"),
    "normalize std vector": (lambda: Trainer(MLP([D, C]), device="cpu", normalize=(0.0, [1, 1, 1, BIG])), "std[3] = "),
}


@pytest.mark.parametrize("case", list(TOO_BIG))
def test_an_int_too_large_for_a_float_is_a_config_error_naming_it(case: str) -> None:
    make, name = TOO_BIG[case]
    with pytest.raises(ConfigError) as info:
        make()
    msg = str(info.value)
    assert name in msg and SHOWN_BIG in msg, msg
    assert len(msg) < 400, msg  # the value is quoted by its size, not its 401 digits


FRACTIONS = [  # taken at their value (these worked before; the refusals below did not)
    (lambda: SGD(lr=Fraction(1, 100)).lr, 0.01),
    (lambda: SGD(momentum=Fraction(9, 10)).momentum, 0.9),
    (lambda: EarlyStopping(min_delta=Fraction(1, 1000)).min_delta, 0.001),
    (lambda: EarlyStopping(patience=np.int64(3)).patience, 3),
    (lambda: StepDecay(step_size=Fraction(20, 2), gamma=Fraction(1, 2)).step_size, 10),
    (lambda: MLP([D, Fraction(10, 1), C]).sizes, (D, 10, C)),
]


def test_fractions_are_taken_at_their_value_and_refused_by_name_beyond_a_float() -> None:
    for make, expected in FRACTIONS:
        got = make()
        assert got == expected and type(got) is type(expected)
    t = Trainer(MLP([D, C]), device="cpu")
    t.fit(*_xy(40), validation_split=Fraction(1, 4))
    assert len(t._engine._x) == 30
    with pytest.raises(ConfigError, match=r"lr must be .*, got Fraction\(1000\.\.\..* beyond the range"):
        SGD(lr=Fraction(BIG, 3))
    with pytest.raises(ConfigError, match=r"validation_split must be .*, got Fraction\(1000\.\.\..* beyond the range"):
        t.fit(*_xy(40), validation_split=Fraction(BIG, 3))
    with pytest.raises(ConfigError, match=r"step_size must be an integer in \[1, \d+\), got Fraction\(5, 2\)"):
        StepDecay(step_size=Fraction(5, 2))
    with pytest.raises(ConfigError, match=r"patience must be an integer >= 1, got Fraction\(3, 1\)"):
        EarlyStopping(patience=Fraction(3, 1))  # integers only, as before: a Fraction is not one


def test_the_shared_checks() -> None:
    assert number("a", Fraction(1, 3), "r") == 1 / 3 and number("a", np.float32(0.5), "r") == 0.5
    assert integer("n", BIG, 0) == BIG  # compared exactly, never through a float
    assert integer("n", 3.0, 0, integral_floats=True) == 3
    for value in (True, "1", None, [1], complex(1, 0)):
        with pytest.raises(ConfigError, match=r"^a must be r, got "):
            number("a", value, "r")
    for value in (float("nan"), float("inf"), BIG, -BIG, Fraction(-BIG, 7)):
        with pytest.raises(ConfigError, match=r"^a must be r, got "):
            number("a", value, "r")
    for value in (2.5, 3.0, True, Fraction(6, 2)):
        with pytest.raises(ConfigError, match=r"^n must be an integer in \[0, 10\), got "):
            integer("n", value, 0, 10)
    assert shown(BIG) == "an integer of about 401 digits (10**400)" and shown(-(10**40)).endswith("(-10**40)")
    assert shown(0.1) == "0.1" and "..." in shown("x" * 200) and len(shown("x" * 200)) < 60


# ---- checkpoints holding such numbers: a DataError naming the file --------------------------------------------


def _rewrite(src: Path, dst: Path, keys: tuple, value: object) -> Path:
    with np.load(src) as npz:
        files = dict(npz.items())
    config = json.loads(str(files["__fastnn_config__"]))
    target = config
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    files["__fastnn_config__"] = np.array(json.dumps(config))
    np.savez(dst, **files)
    return dst


CHECKPOINT = {  # each raised a raw OverflowError from Trainer.load before
    "lr": (("optimizer", "lr"), ["lr", SHOWN_BIG]),
    "momentum": (("optimizer", "momentum"), ["momentum", SHOWN_BIG]),
    "sizes": (("model", "sizes"), ["sizes[1]", SHOWN_BIG]),
    "normalize": (("normalize",), ["normalize mean", SHOWN_BIG]),
    "history loss": (("history", 0, "train_loss"), ["too large for a float"]),
    "history seconds": (("history", 0, "seconds"), ["too large for a float"]),
}


@pytest.mark.parametrize("case", list(CHECKPOINT))
def test_a_checkpoint_holding_a_number_too_large_for_a_float_is_a_data_error_naming_the_file(
    case: str, tmp_path: Path
) -> None:
    t = Trainer(MLP([D, 5, C]), SGD(lr=0.1, momentum=0.9), device="cpu")
    t.fit(*_xy(), epochs=1)
    src = tmp_path / "good.npz"
    t.save(src)
    keys, words = CHECKPOINT[case]
    value = [BIG, 1.0] if case == "normalize" else [D, BIG, C] if case == "sizes" else BIG
    bad = _rewrite(src, tmp_path / "bad.npz", keys, value)
    with pytest.raises(DataError) as info:
        Trainer.load(bad, device="cpu")
    for w in (str(bad), "invalid config", *words):
        assert w in str(info.value), f"{w!r} not in: {info.value}"


# ---- the scikit-learn estimators ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [BIG, Fraction(1, 100)], ids=["10**400", "Fraction"])
def test_sklearn_learning_rate_init_too_large_or_a_fraction(value: object) -> None:
    pytest.importorskip("sklearn")
    from fastnn.sklearn import MLPClassifier

    x, y = _xy()
    est = MLPClassifier(learning_rate_init=value, max_iter=1, device="cpu")
    if value == BIG:
        with pytest.raises(ConfigError, match=r"learning_rate_init.*10\*\*400"):
            est.fit(x, y)
    else:
        est.fit(x, y)
        assert est.trainer_.optimizer.lr == 0.01
