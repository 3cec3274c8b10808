"""The training state stays whole and trusted, on the CPU: an epoch counts only with a finite loss and a finite
state, interrupts leave counters, history and weights at the same epoch, `save` writes only what `load` takes,
values are checked in the type that holds them, counters stay in range, and a long fit builds its lr table per
chunk. The GPU halves are in tests/test_gpu_engines.py."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _checkpoints import rewrite

from fastnn import MLP, SGD, AdamW, ConfigError, DataError, FastnnError, Trainer, TrainingDiverged
from fastnn import _fit as fit_module
from fastnn import _progress as progress_module
from fastnn._model import init_parameters
from fastnn._state import MAX_EPOCH
from fastnn.engine.base import Engine
from fastnn.engine.numpy_engine import NumpyEngine

D, C = 4, 3


def _data(n: int = 64, scale: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, D)) * scale).astype(np.float32), rng.integers(0, C, size=n)


def _state(t: Trainer) -> dict[str, np.ndarray]:
    return t._engine.get_state()  # parameters and optimizer state


def _assert_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _counters(t: Trainer) -> tuple[int, int, list]:
    return t.epoch, t.step, list(t.history)


def _names(exc: BaseException, *words: str) -> None:
    for w in words:
        assert w in str(exc), f"{w!r} not in: {exc}"


# ---- an epoch is finite only if its loss and the state it leaves are ------------------------------------------------


def test_last_update_making_weights_inf_is_divergence_and_save_stays_loadable(tmp_path: Path) -> None:
    # The issue's reproducer: 4 features scaled by 1e6, SGD(lr=1e34), batch = N, one epoch. The loss (measured
    # before the update) is finite; the update makes the weights inf.
    x, y = _data(scale=1e6)  # beyond float16: precision "fp32" takes such inputs (issue 23 item 7)
    model = MLP([D, 8, C])
    t = Trainer(model, SGD(lr=1e34), batch_size=len(x), precision="fp32", device="cpu")
    with pytest.raises(TrainingDiverged) as info:
        t.fit(x, y, epochs=1)
    assert info.value.epoch == 1 and math.isfinite(info.value.loss)
    _names(info.value, "epoch 1", "weight", "not a finite float32")
    _assert_state(t.state_dict(), init_parameters(model, 0))  # nothing finite was trained
    assert _counters(t) == (0, 0, [])
    t.save(tmp_path / "m.npz")  # the kept state is the initial one, and it loads
    _assert_state(Trainer.load(tmp_path / "m.npz", device="cpu").state_dict(), init_parameters(model, 0))


def test_state_divergence_in_a_later_epoch_keeps_the_epoch_before(tmp_path: Path) -> None:
    x, y = _data(scale=1e6)
    sched = lambda s: 1e-9 if s < 1 else 1e34  # noqa: E731 - epoch 1 is harmless, epoch 2's update is not
    t = Trainer(
        MLP([D, 8, C]), SGD(lr=0.1, momentum=0.5), batch_size=len(x), precision="fp32", device="cpu", schedule=sched
    )  # 1e6 inputs are beyond float16: precision "fp32" takes them (issue 23 item 7)
    t.fit(x, y, epochs=1)
    good, counters = _state(t), _counters(t)
    with pytest.raises(TrainingDiverged, match="epoch 2"):
        t.fit(x, y, epochs=2)
    _assert_state(_state(t), good)  # momentum buffers included
    assert _counters(t) == counters
    t.save(tmp_path / "m.npz")
    loaded = Trainer.load(tmp_path / "m.npz", device="cpu", schedule=sched)
    _assert_state(_state(loaded), good)


@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_weights_beyond_float16_are_divergence_in_half_precisions(precision: str) -> None:
    x, y = _data()
    model = MLP([D, C])
    t = Trainer(model, SGD(lr=1e6), batch_size=len(x), precision=precision, device="cpu")
    with pytest.raises(TrainingDiverged) as info:
        t.fit(x, y, epochs=1)
    assert math.isfinite(info.value.loss)
    _names(info.value, "float16", f"precision={precision!r}")
    _assert_state(t.state_dict(), init_parameters(model, 0))
    f32 = Trainer(model, SGD(lr=1e6), batch_size=len(x), precision="fp32", device="cpu")
    f32.fit(x, y, epochs=1)  # the same weights are fine where float32 holds them
    assert np.abs(f32.state_dict()["0.weight"]).max() > 65520


# ---- after any interrupt, counters, history and weights describe the same moment ------------------------------------


def _reference(epochs: int, **kw) -> dict[str, np.ndarray]:
    t = _small(**kw)
    x, y = _data()
    t.fit(x, y, epochs=epochs)
    return _state(t)


def _small(**kw) -> Trainer:
    args = dict(model=MLP([D, 8, C]), optimizer=SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu", seed=2)
    return Trainer(**{**args, **kw})


def _raise_on_call(n: int, real: Callable, error: type[BaseException] = KeyboardInterrupt) -> Callable:
    """`real` that raises `error` on its n-th call (from 1) instead of running."""
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise error()
        return real(*args, **kwargs)

    return wrapper


def _assert_consistent(t: Trainer, epochs: int, evaluated: list[bool]) -> None:
    """t is at the end of epoch `epochs - 1`: counters, history and weights agree, and continuing to 4 epochs
    gives exactly what an uninterrupted run gives."""
    assert (t.epoch, t.step) == (epochs, 4 * epochs)
    assert [r["epoch"] for r in t.history] == list(range(1, epochs + 1))  # numbered from 1
    assert [r["eval_loss"] is not None for r in t.history] == evaluated
    _assert_state(_state(t), _reference(epochs))
    x, y = _data()
    t.fit(x, y, epochs=4 - epochs)
    _assert_state(_state(t), _reference(4))


def test_ctrl_c_during_evaluation_reports_the_trained_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _data()
    t = _small()
    monkeypatch.setattr(NumpyEngine, "evaluate", _raise_on_call(2, NumpyEngine.evaluate))  # epoch 1's evaluation
    with pytest.raises(KeyboardInterrupt):
        t.fit(x, y, epochs=3, eval_data=(x, y))
    monkeypatch.undo()
    _assert_consistent(t, 2, [True, False])  # epoch 1 trained, its evaluation did not finish


def test_ctrl_c_during_a_step_undoes_the_unfinished_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _data()
    t = _small()
    monkeypatch.setattr(NumpyEngine, "_step", _raise_on_call(7, NumpyEngine._step))  # step 2 of epoch 1
    with pytest.raises(KeyboardInterrupt):
        t.fit(x, y, epochs=3)
    monkeypatch.undo()
    _assert_consistent(t, 1, [False])


def test_interrupt_between_the_engine_counting_an_epoch_and_the_trainer_recording_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x, y = _data()
    t = _small()
    real = Engine.report
    calls = [0]

    def report(self, stats, on_epoch, quiet=False):
        calls[0] += 1
        if calls[0] == 2:  # epoch 1 counts as reported, and Ctrl-C lands before on_epoch runs
            self.last_reported = stats
            raise KeyboardInterrupt
        real(self, stats, on_epoch, quiet)

    monkeypatch.setattr(Engine, "report", report)
    with pytest.raises(KeyboardInterrupt):
        t.fit(x, y, epochs=3)
    monkeypatch.undo()
    _assert_consistent(t, 2, [False, False])


def test_interrupt_while_printing_progress_keeps_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    # A failing stream (OSError, ValueError) only turns the display off now (tests/test_progress.py); Ctrl-C
    # landing in the print still interrupts the fit.
    x, y = _data()
    t = _small()
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: False)  # plain lines, tqdm installed or not
    monkeypatch.setattr(progress_module, "print_epoch", _raise_on_call(2, lambda *a: None, KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        t.fit(x, y, epochs=3, progress=True)
    monkeypatch.undo()
    _assert_consistent(t, 2, [False, False])


# ---- save never writes what load refuses ----------------------------------------------------------------------------


def test_adamw_second_moment_overflow_is_divergence_and_the_saved_file_stays_good(tmp_path: Path) -> None:
    # The issue's reproducer: inputs around 1e22 overflow exp_avg_sq (g*g) while the weights (the update is
    # m / sqrt(inf) = 0) and the loss stay finite.
    path = tmp_path / "m.npz"
    t = Trainer(MLP([D, 8, C]), AdamW(lr=1e-3), batch_size=16, precision="fp32", device="cpu")  # 1e22: beyond fp16
    x, y = _data()
    t.fit(x, y, epochs=1)
    t.save(path)
    good, counters = _state(t), _counters(t)
    with pytest.raises(TrainingDiverged) as info:
        t.fit(_data(scale=1e22)[0], y, epochs=1)
    _names(info.value, "epoch 2", "opt.exp_avg_sq.", "inf")
    _assert_state(_state(t), good)
    assert _counters(t) == counters
    t.save(path)
    loaded = Trainer.load(path, device="cpu")
    _assert_state(_state(loaded), good)
    assert _counters(loaded) == counters


POISON = {
    "exp_avg_sq inf": (lambda t: t._engine.set_state({"opt.exp_avg_sq.0.weight": np.full((8, D), np.inf)}),
                       ["'opt.exp_avg_sq.0.weight'", "inf"]),
    "exp_avg_sq negative": (lambda t: t._engine.set_state({"opt.exp_avg_sq.2.bias": -np.ones(C)}),
                            ["'opt.exp_avg_sq.2.bias'", "-1.0", ">= 0"]),
    "weight beyond float32": (lambda t: t._engine.set_state({"2.weight": np.full((C, 8), 1e39)}),
                              ["'2.weight'", "inf", "finite"]),
    "history NaN": (lambda t: t.history._records[0].update(train_loss=math.nan),
                    ["history[0]['train_loss']", "nan"]),
    "epoch beyond 2**32": (lambda t: setattr(t, "epoch", 2**40), ["epoch", str(2**40)]),
    "negative step": (lambda t: setattr(t, "step", -1), ["step", "-1"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(POISON))
def test_save_refuses_what_load_would_and_keeps_the_old_file(tmp_path: Path, case: str) -> None:
    path = tmp_path / "m.npz"
    t = Trainer(MLP([D, 8, C]), AdamW(lr=1e-3), batch_size=16, precision="fp32", device="cpu")  # 1e22: beyond fp16
    x, y = _data()
    t.fit(x, y, epochs=1)
    t.save(path)
    before = path.read_bytes()
    poison, words = POISON[case]
    poison(t)
    with pytest.raises(DataError) as info:
        t.save(path)
    _names(info.value, str(path), *words)
    assert path.read_bytes() == before  # byte-identical: the last good file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]
    Trainer.load(path, device="cpu")


# ---- finite in the type actually used -------------------------------------------------------------------------------


def _fails_cleanly(t: Trainer, call: Callable[[], object], error: type[Exception], *words: str) -> None:
    before, counters = _state(t), _counters(t)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, FastnnError)
    _names(info.value, *words)
    _assert_state(_state(t), before)
    assert _counters(t) == counters


def test_load_state_dict_checks_after_the_float32_cast() -> None:
    t = _small()
    sd = {k: v.astype(np.float64) for k, v in t.state_dict().items()}
    sd["0.bias"][3] = 1e39  # finite in float64, inf in float32
    _fails_cleanly(t, lambda: t.load_state_dict(sd), DataError, "state_dict['0.bias']", "1e+39", "(3,)", "float32")


@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_weights_beyond_float16_refused_where_float16_holds_or_feeds_them(precision: str) -> None:
    t = _small(precision=precision)
    sd = t.state_dict()
    sd["2.weight"][1, 2] = 70000.0
    _fails_cleanly(t, lambda: t.load_state_dict(sd), DataError, "'2.weight'", "70000.0", "float16", precision)
    t32 = _small(precision="fp32")
    t32.load_state_dict(sd)  # float32 weights take it
    assert t32.state_dict()["2.weight"][1, 2] == 70000.0


def test_load_checks_the_files_arrays_after_the_cast(tmp_path: Path) -> None:
    t = _small(precision="fp16")
    t.save(tmp_path / "good.npz")

    def f64_1e39(config, arrays):
        arrays["0.weight"] = arrays["0.weight"].astype(np.float64)
        arrays["0.weight"][0, 0] = 1e39

    def beyond_fp16(config, arrays):
        arrays["0.weight"] = arrays["0.weight"].copy()
        arrays["0.weight"][0, 1] = -1e5

    for edit, words in ((f64_1e39, ["1e+39", "float32"]), (beyond_fp16, ["-100000.0", "float16", "'fp16'"])):
        bad = rewrite(tmp_path / "good.npz", tmp_path / "bad.npz", edit)
        with pytest.raises(DataError) as info:
            Trainer.load(bad, device="cpu")
        _names(info.value, str(bad), "'0.weight'", *words)


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda: SGD(lr=1e300), ["lr", "1e+300", "float32"]),
        (lambda: AdamW(lr=1e300), ["lr", "1e+300", "float32"]),
        (lambda: SGD(lr=1e-300), ["lr", "1e-300", "float32"]),  # rounds to 0
        (lambda: AdamW(eps=1e-50), ["eps", "1e-50", "float32"]),
        (lambda: AdamW(betas=(0.9, 1 - 1e-12)), ["betas[1]", "0.999999999999", "float32"]),  # rounds to 1
        (lambda: SGD(momentum=1 - 1e-10), ["momentum", "float32"]),
    ],
)
def test_optimizer_numbers_checked_in_float32(make: Callable[[], object], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    _names(info.value, *words)


def test_schedule_value_checked_in_the_float32_lr_table() -> None:
    t = _small(schedule=lambda s: 0.1 if s < 5 else 1e300)
    x, y = _data()
    _fails_cleanly(t, lambda: t.fit(x, y, epochs=2), ConfigError, "schedule(5)", "1e+300", "float32")


@pytest.mark.parametrize("normalize,words", [((0, 1e-300), ["1e-300", "inf"]), ((1e300, 1.0), ["1e+300", "-inf"])])
def test_normalize_that_overflows_float32_is_a_config_error(normalize, words) -> None:
    with pytest.raises(ConfigError) as info:  # not TrainingDiverged at the first step
        _small(normalize=normalize)
    _names(info.value, "normalize", *words)


# ---- raw errors where a named one is due ----------------------------------------------------------------------------


def test_epochs_as_numpy_uint64_max_is_a_config_error() -> None:
    t = _small()
    x, y = _data()
    t.fit(x, y, epochs=1)
    _fails_cleanly(t, lambda: t.fit(x, y, epochs=np.uint64(2**64 - 1)), ConfigError, "epochs", str(2**64 - 1))


def test_a_model_too_big_to_allocate_is_refused_naming_the_bytes() -> None:
    with pytest.raises(ConfigError) as info:
        MLP([4, 2**40, 3])
    _names(info.value, "sizes", "8,796,093,022,211 parameters", "35,184,372,088,844 bytes", "TiB", "2**31")


# ---- checkpoint values accepted but wrong ---------------------------------------------------------------------------


def _set(key: str, value: object) -> Callable[[dict, dict], None]:
    return lambda config, arrays: config.__setitem__(key, value)


def _set_record(field: str, value: object) -> Callable[[dict, dict], None]:
    return lambda config, arrays: config["history"][0].__setitem__(field, value)


def _negative_second_moment(config: dict, arrays: dict) -> None:
    arrays["opt.exp_avg_sq.0.bias"] = -np.abs(arrays["opt.exp_avg_sq.0.bias"]) - 1.0


BAD_VALUES = {
    "epoch 10**30": (_set("epoch", 10**30), ["epoch", str(10**30)]),
    "epoch past 2**32": (_set("epoch", 2**32 + 1), ["epoch", str(2**32 + 1)]),
    "epoch float": (_set("epoch", 1.0), ["epoch", "1.0"]),
    "step 10**30": (_set("step", 10**30), ["step", str(10**30)]),
    "step negative": (_set("step", -4), ["step", "-4"]),
    "step string": (_set("step", "4"), ["step", "'4'"]),
    "loss NaN": (_set_record("train_loss", math.nan), ["history[0]['train_loss']", "nan"]),
    "loss negative": (_set_record("eval_loss", -0.5), ["history[0]['eval_loss']", "-0.5"]),
    "loss inf": (_set_record("train_loss", math.inf), ["history[0]['train_loss']", "inf"]),
    "accuracy above 1": (_set_record("train_accuracy", 1.5), ["history[0]['train_accuracy']", "1.5"]),
    "accuracy NaN": (_set_record("eval_accuracy", math.nan), ["history[0]['eval_accuracy']", "nan"]),
    "seconds negative": (_set_record("seconds", -1.0), ["history[0]['seconds']", "-1.0"]),
    "record epoch 2**32 + 1": (_set_record("epoch", 2**32 + 1), ["history[0]['epoch']", str(2**32 + 1)]),
    "record epoch 0": (_set_record("epoch", 0), ["history[0]['epoch']", "[1, 2**32]", "got 0"]),
    "half an evaluation": (_set_record("eval_loss", None), ["history[0]", "eval_loss", "eval_accuracy"]),
    "negative exp_avg_sq": (_negative_second_moment, ["'opt.exp_avg_sq.0.bias'", ">= 0"]),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_load_refuses_values_no_trainer_could_have_saved(tmp_path: Path, case: str) -> None:
    t = Trainer(MLP([D, 8, C]), AdamW(lr=1e-3), batch_size=16, precision="fp32", device="cpu")  # 1e22: beyond fp16
    x, y = _data()
    t.fit(x, y, epochs=1, eval_data=(x, y))
    t.save(tmp_path / "good.npz")
    Trainer.load(tmp_path / "good.npz", device="cpu")
    edit, words = BAD_VALUES[case]
    bad = rewrite(tmp_path / "good.npz", tmp_path / "bad.npz", edit)
    with pytest.raises(DataError) as info:
        Trainer.load(bad, device="cpu")
    _names(info.value, str(bad), *words)


def test_epoch_counter_stops_at_2_32_and_a_trainer_there_saves_and_loads(tmp_path: Path) -> None:
    t = _small()
    x, y = _data()
    t.fit(x, y, epochs=1)
    t.save(tmp_path / "m.npz")
    near = rewrite(tmp_path / "m.npz", tmp_path / "near.npz", _set("epoch", MAX_EPOCH - 2))
    t = Trainer.load(near, device="cpu")
    _fails_cleanly(t, lambda: t.fit(x, y, epochs=3), ConfigError, "epochs", "got 3", "[0, 2]", str(MAX_EPOCH - 2))
    t.fit(x, y, epochs=2)  # epochs 2**32 - 2 and 2**32 - 1: the last ones a 32-bit epoch index reaches
    assert t.epoch == MAX_EPOCH and [r["epoch"] for r in t.history][-2:] == [MAX_EPOCH - 1, MAX_EPOCH]
    _fails_cleanly(t, lambda: t.fit(x, y, epochs=1), ConfigError, "epochs", "got 1", "[0, 0]")
    t.save(tmp_path / "full.npz")  # what save writes, load takes
    assert Trainer.load(tmp_path / "full.npz", device="cpu").epoch == MAX_EPOCH


# ---- a long fit builds its lr table per chunk of epochs -------------------------------------------------------------


def test_fit_of_10_7_epochs_builds_one_chunk_of_lr_table_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    t = _small()
    x, y = _data()  # 4 steps per epoch: 4 * 10**7 steps in all
    built = []
    real = fit_module.lr_table

    def lr_table(schedule, first_step, steps):
        assert steps <= fit_module.LR_CHUNK_STEPS, f"a table of {steps} steps"
        built.append(steps)
        return real(schedule, first_step, steps)

    class Stop(Exception):
        pass

    def fit_epochs(first_epoch, first_step, lrs, *rest, **options):
        raise Stop(len(lrs))

    monkeypatch.setattr(fit_module, "lr_table", lr_table)
    monkeypatch.setattr(t._engine, "fit_epochs", fit_epochs)
    with pytest.raises(Stop) as info:
        t.fit(x, y, epochs=10**7)
    assert built == [fit_module.LR_CHUNK_STEPS] == [info.value.args[0]]  # 2**20 steps: 2**18 whole epochs


def test_chunked_fit_equals_one_table_and_stops_cleanly_at_a_bad_step(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _data()
    sched = lambda s: 0.05 * (1 + s % 3)  # noqa: E731
    whole = _small(schedule=sched)
    h_whole = whole.fit(x, y, epochs=7, eval_data=(x, y), eval_every=3)
    monkeypatch.setattr(fit_module, "LR_CHUNK_STEPS", 9)  # chunks of 2 epochs of 4 steps
    chunked = _small(schedule=sched)
    h_chunked = chunked.fit(x, y, epochs=7, eval_data=(x, y), eval_every=3)
    _assert_state(_state(chunked), _state(whole))
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(h_chunked) == strip(h_whole)
    assert [r["eval_loss"] is not None for r in h_chunked] == [False, False, True, False, False, True, True]
    # A schedule failing in a later chunk: the chunks before it are trained and recorded, nothing else.
    failing = _small(schedule=lambda s: sched(s) if s < 21 else math.nan)
    with pytest.raises(ConfigError, match=re.escape("schedule(21)")):
        failing.fit(x, y, epochs=10**7)
    assert _counters(failing)[:2] == (4, 16) and len(failing.history) == 4
    reference = _small(schedule=sched)
    reference.fit(x, y, epochs=4)
    _assert_state(_state(failing), _state(reference))


# ---- finite epochs, GPU side, checked on the CPU: the EpochState layout and the epoch-end kernels -------------------


def test_epoch_state_struct_and_its_numpy_dtype_agree() -> None:
    from fastnn.cuda import nvrtc
    from fastnn.engine.epochs import BAD_STATE_OFFSET, EPOCH_STATE_DTYPE

    source = (nvrtc.native_dir() / "common.cuh").read_text()
    body = re.search(r"struct EpochState \{(.*?)\};", source, re.S).group(1)
    fields = re.findall(r"^\s*([\w ]+?\*?)\s*(\w+);", body, re.M)
    sizes = {"u32": 4, "u64": 8, "const float*": 8, "double*": 8}
    assert [name for _, name in fields] == list(EPOCH_STATE_DTYPE.names)
    assert [sizes[t.strip()] for t, _ in fields] == [EPOCH_STATE_DTYPE[n].itemsize for n in EPOCH_STATE_DTYPE.names]
    assert BAD_STATE_OFFSET == EPOCH_STATE_DTYPE.fields["bad_state"][1] == 20


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_epoch_cu_compiles_with_the_epoch_end_kernels(arch: str, tmp_path: Path, monkeypatch) -> None:
    from fastnn.cuda import nvrtc

    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    cubin = nvrtc.compile_native("epoch.cu", arch)
    for kernel in (b"check_state", b"snapshot", b"advance"):
        assert kernel + b"\0" in cubin, kernel
