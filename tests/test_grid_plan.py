"""The grid engine's plan on the CPU: the CTAs and the units each owns, the shared memory and global scratch the
kernel needs, its refusals naming their limits, and the kernel compiled (NVRTC, sm_90) with plans' options, where
static_asserts check that the kernel's layouts need no more than the bytes the plan computed."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fastnn import MLP, SGD, AdamW
from fastnn.cuda import nvrtc
from fastnn.engine import Tuning
from fastnn.engine.base import EngineConfig
from fastnn.engine.grid import plan as gp

MOMENTUM = SGD(lr=0.01, momentum=0.9)


def _cfg(sizes, optimizer=MOMENTUM, precision="mixed", batch=32, loss="cross_entropy", activation="relu", **kw):
    return EngineConfig(model=MLP(sizes, activation=activation), optimizer=optimizer, batch_size=batch,
                        precision=precision, loss=loss, **kw)  # fmt: skip


def _plan(sizes, *args, x_dtype=np.uint8, sms=gp.HOPPER_SMS, smem=gp.HOPPER_SMEM, **kw):
    return gp.grid_plan(_cfg(sizes, *args, **kw), x_dtype, sms, smem)


def _option(plan: gp.GridPlan, name: str) -> str:
    (value,) = [o.split("=", 1)[1] for o in plan.options if o.startswith(f"-D{name}=")]
    return value


@pytest.mark.parametrize(
    "sizes,sms",
    [
        ([784, 256, 256, 256, 10], 132),
        ([784, 1024, 1024, 1024, 10], 132),
        ([784, 4096, 4096, 10], 132),
        ([784, 4096, 4096, 10], 114),  # an H100 PCIe
        ([30, 37, 37, 37, 37, 10], 132),
        ([20, 100, 37, 10], 132),
        ([20, 1032, 10], 132),
        ([5, 3, 2], 132),
        ([784, 8192, 10], 78),
    ],
)
def test_every_unit_is_owned_by_exactly_one_cta_and_ctas_fit_the_sms(sizes, sms):
    plan = _plan(sizes, sms=sms)
    assert isinstance(plan, gp.GridPlan), plan
    assert 1 <= plan.ctas <= sms
    assert plan.ctas == min(sms, -(-max(sizes[1:-1]) // gp.UNITS_PER_CTA))
    assert len(plan.units) == len(sizes) - 2
    for width, nb in zip(sizes[1:-1], plan.units):
        owner = np.full(width, -1)
        for p in range(plan.ctas):  # CTA p owns [p * nb, p * nb + nb) clipped to the layer
            block = owner[p * nb : min(width, (p + 1) * nb)]
            assert (block == -1).all(), (width, p)
            block[:] = p
        assert (owner >= 0).all(), width
    assert _option(plan, "GRID_P") == str(plan.ctas)
    assert plan.smem_bytes <= gp.HOPPER_SMEM and _option(plan, "GRID_SMEM") == str(plan.smem_bytes)
    assert plan.scratch_bytes <= gp.MAX_SCRATCH and _option(plan, "GRID_SCRATCH") == str(plan.scratch_bytes)


@pytest.mark.parametrize("hidden,rounds", [(1, 1), (2, 2), (3, 4), (4, 6), (6, 10)])
def test_rounds_per_step_are_the_forward_boundaries_plus_the_unshared_backward_ones(hidden, rounds):
    assert gp.rounds_per_step(hidden) == rounds
    plan = _plan([20] + [40] * hidden + [10])
    assert plan.rounds == rounds


@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), MOMENTUM, AdamW(lr=1e-3)], ids=["sgd", "momentum", "adamw"])
def test_every_mlp_is_served_up_to_the_promised_widths_and_batches(precision, optimizer):
    for sizes in ([784, 256, 256, 256, 10], [784, 1024, 1024, 10], [3, 8192, 2], [8192, 16, 400]):
        for batch in (1, 32, 512):
            plan = _plan(sizes, optimizer, precision, batch)
            assert isinstance(plan, gp.GridPlan), (sizes, batch, plan)
    assert isinstance(_plan([784, 4096, 4096, 10], optimizer, precision, gp.MAX_BATCH), gp.GridPlan)


def test_the_scratch_is_what_the_kernel_lays_out():
    sizes, batch = (784, 512, 300, 10), 48
    ctas = -(-512 // gp.UNITS_PER_CTA)
    up32 = lambda a: -(-a // 32) * 32  # noqa: E731
    parity = 2 * (2 * up32(batch * 512) + 2 * up32(batch * 300))  # H, Z of both hidden layers, two parities
    head = 2 * up32(10 * 300)
    per_cta = up32(batch * 10) + up32(batch * 300) + up32(batch * -(-512 // ctas)) + up32(batch * 784)
    assert gp.scratch_floats(sizes, batch, ctas) == parity + head + ctas * per_cta
    assert _plan(list(sizes), batch=batch).scratch_bytes == 4 * (parity + head + ctas * per_cta)


def test_logistic_regression_is_refused_by_name():
    assert _plan([784, 10]) == "no hidden layer to spread; use engine='fused' or 'graph'"


@pytest.mark.parametrize(
    "sizes,batch,smem,expect",
    [
        ([784, 256, 10], gp.MAX_BATCH + 1, gp.HOPPER_SMEM, "a batch of 1025 rows is over the grid kernel's maximum "
                                                          "of 1024"),
        ([784, 8193, 10], 32, gp.HOPPER_SMEM, "a layer of 8193 is wider than the grid kernel's 8192"),
        ([784, 256, 4000], 1024, 60000, "a batch of 1024 with 4000 classes needs 93,184 bytes of shared memory per "
                                        "CTA, over the GPU's 60,000"),
        ([8192, 8192, 8192, 10], 1024, gp.HOPPER_SMEM, "bytes of global scratch over 132 CTAs, over the grid kernel's "
                                                     "8,589,934,592"),
    ],
)  # fmt: skip
def test_a_model_over_a_limit_is_refused_naming_it(sizes, batch, smem, expect):
    reason = _plan(sizes, batch=batch, smem=smem)
    assert isinstance(reason, str) and expect in reason, reason


def test_a_regression_differs_only_in_its_loss_define():
    clf, reg = _plan([30, 37, 37, 1]), _plan([30, 37, 37, 1], loss="mse")
    assert (_option(clf, "GRID_LOSS"), _option(reg, "GRID_LOSS")) == ("0", "1")
    assert [o for o in reg.options if "GRID_LOSS" not in o] == [o for o in clf.options if "GRID_LOSS" not in o]


def test_the_phase_profile_is_a_tuning_compiled_in_as_a_define():
    assert "-DGRID_PROFILE" not in _plan([784, 128, 10]).options
    assert _plan([784, 128, 10], tuning=Tuning(grid_profile=True)).options[-1] == "-DGRID_PROFILE"


def _device(cc=(9, 0), sms=132, smem=gp.HOPPER_SMEM):
    return types.SimpleNamespace(compute_capability=cc, sm_count=sms, max_shared_memory_optin=smem, name="GPU",
                                 arch=f"sm_{cc[0]}{cc[1]}")  # fmt: skip


@pytest.mark.bindings
@pytest.mark.parametrize(
    "kw,cc,expect",
    [
        ({"data_placement": "host"}, (9, 0), "data_placement='host' needs engine='graph'"),
        ({"normalize": (np.zeros(20), np.ones(20))}, (9, 0), "not per-feature vectors"),
        ({}, (8, 0), "it needs cooperative launches and bulk copies (compute capability 9.0 or newer); GPU is sm_80"),
        ({}, (9, 0), None),
        ({"normalize": (0.5, 2.0)}, (9, 0), None),
    ],
)
def test_the_engine_names_what_the_plan_cannot_see(kw, cc, expect):
    from fastnn.engine.grid import GridEngine

    reason = GridEngine.unsupported_reason(_cfg([20, 40, 3], **kw), _device(cc))
    assert reason == expect if expect is None else expect in reason


# One kernel per precision, optimizer kind, loss, activation and input type: the static_asserts in grid.cu fail to
# compile if its layouts need more than GRID_SMEM or GRID_SCRATCH, i.e. if the plan ever undercounts.
KERNELS = [
    ([784, 256, 256, 256, 10], MOMENTUM, "mixed", np.float32, "cross_entropy", "relu", 64),  # grid_fast.cu's at 32
    ([20, 37, 2], SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3), "fp32", np.float32, "cross_entropy",
     "relu", 1),
    ([30, 37, 37, 37, 37, 10], AdamW(lr=1e-3), "fp16", np.float32, "mse", "gelu", 1000),
    ([784, 1024, 1024, 10], SGD(lr=0.1), "mixed", np.uint8, "cross_entropy", "gelu", 64),
]  # fmt: skip


@pytest.mark.bindings
@pytest.mark.parametrize("sizes,optimizer,precision,x_dtype,loss,activation,batch", KERNELS)
def test_the_kernel_compiles(sizes, optimizer, precision, x_dtype, loss, activation, batch, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan(sizes, optimizer, precision, batch, loss, activation, x_dtype=x_dtype)
    assert isinstance(plan, gp.GridPlan) and plan.source == "grid.cu", plan
    assert nvrtc.compile_native("grid.cu", "sm_90", plan.options)[:4] == b"\x7fELF"


@pytest.mark.bindings
def test_the_kernel_compiles_with_the_phase_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, 128, 128, 10], tuning=Tuning(grid_profile=True))
    assert nvrtc.compile_native("grid.cu", "sm_90", plan.options)[:4] == b"\x7fELF"


@pytest.mark.bindings
@pytest.mark.parametrize("name,message", [("GRID_SMEM", "shared-memory size is smaller"),
                                          ("GRID_SCRATCH", "global scratch is smaller")])  # fmt: skip
def test_an_undercounted_plan_fails_to_compile(name, message, monkeypatch, tmp_path):
    """The cross-checks above can fail: a plan claiming one 4-byte word too few is rejected by the compiler."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, 100, 37, 10], batch=20)
    value = int(_option(plan, name))
    options = [o if not o.startswith(f"-D{name}=") else f"-D{name}={value - 4}" for o in plan.options]
    with pytest.raises(Exception, match=message):
        nvrtc.compile_native("grid.cu", "sm_90", options)


# ---- the fast path (native/grid_fast.cu) -----------------------------------------------------------------------------
# (sizes, optimizer, precision, x_dtype, batch, kwargs, the kernel the plan must pick)
CHOICES = [
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid_fast.cu"),
    ([784, 128, 128, 128, 10], MOMENTUM, "mixed", np.uint8, 1, {}, "grid_fast.cu"),
    ([784, 512, 512, 512, 16], MOMENTUM, "mixed", np.uint8, 20, {"normalize": (0.5, 0.25)}, "grid_fast.cu"),
    ([784, 1024, 1024, 1024, 2], SGD(lr=0.1, weight_decay=1e-4), "mixed", np.uint8, 32, {}, "grid_fast.cu"),
    ([784, 640, 640, 640, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid_fast.cu"),  # momentum on chip
    ([64, 256, 256, 256, 10], SGD(lr=0.1, momentum=0.9, nesterov=True), "mixed", np.uint8, 32, {}, "grid_fast.cu"),
    ([784, 1024, 1024, 1024, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid_fast.cu"),  # momentum in L2
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.float32, 32, {}, "grid_fast.cu"),  # rows staged as fp16
    ([784, 640, 640, 640, 10], MOMENTUM, "mixed", np.float32, 32, {"normalize": (0.5, 0.25)}, "grid_fast.cu"),
    ([784, 768, 768, 768, 10], SGD(lr=0.1), "mixed", np.float32, 32, {}, "grid.cu"),  # fp16 rows: > 227 KB
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "fp32", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "fp16", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 256, 256, 10], AdamW(lr=1e-3), "mixed", np.uint8, 32, {}, "grid_fast.cu"),  # moments on chip
    ([784, 512, 512, 512, 10], AdamW(lr=1e-3, weight_decay=0.01), "mixed", np.uint8, 8, {}, "grid_fast.cu"),  # in L2
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 33, {}, "grid.cu"),
    ([784, 256, 256, 256, 17], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 512, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 192, 192, 192, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([785, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {"activation": "gelu"}, "grid.cu"),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {"loss": "mse"}, "grid.cu"),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {"tuning": Tuning(grid_fast=False)}, "grid.cu"),
]  # fmt: skip


@pytest.mark.parametrize("sizes,optimizer,precision,x_dtype,batch,kw,source", CHOICES)
def test_the_plan_picks_the_fast_kernel_exactly_where_it_serves(sizes, optimizer, precision, x_dtype, batch, kw,
                                                                 source):  # fmt: skip
    plan = _plan(sizes, optimizer, precision, batch, x_dtype=x_dtype, **kw)
    assert isinstance(plan, gp.GridPlan), plan
    assert plan.source == source, plan.why
    if source == "grid_fast.cu":
        h = sizes[1]
        assert (plan.function, plan.ctas, plan.units, plan.rounds) == ("grid_fast_kernel", h // 8, (8, 8, 8), 4)
        assert plan.phases == gp.FAST_PHASES and plan.why.startswith("grid_fast.cu: ")
        n_state = len(optimizer.state_names)
        assert plan.smem_bytes == int(_option(plan, "GRID_SMEM"))
        assert plan.scratch_bytes == int(_option(plan, "GRID_SCRATCH"))
        assert _option(plan, "GRID_SHIFT") == ("1" if "normalize" in kw and x_dtype == np.uint8 else "0")
        xb = 2 if x_dtype == np.float32 else 1
        on_chip = gp.fast_smem_bytes(sizes[0], h, n_state, False, xb) <= gp.HOPPER_SMEM and n_state * h // 128 <= 8
        momg = n_state >= 1 and not on_chip
        assert _option(plan, "GRID_MOMG") == str(int(momg)) and ("optimizer state in L2" in plan.why) == momg
        assert plan.smem_bytes == gp.fast_smem_bytes(sizes[0], h, n_state, momg, xb)
        assert _option(plan, "GRID_XIN") == str(xb - 1)
        assert plan.scratch_bytes == gp.fast_scratch_bytes(h, sizes[0], n_state, momg)
    else:
        assert plan.function == "grid_epoch_kernel" and plan.phases == gp.V1_PHASES
        assert plan.why.startswith("grid.cu (v1), not grid_fast.cu: ")


def test_the_fast_path_stops_at_one_cta_per_sm():
    assert _plan([784, 1024, 1024, 1024, 10], SGD(lr=0.1)).source == "grid_fast.cu"
    plan = _plan([784, 1024, 1024, 1024, 10], SGD(lr=0.1), sms=120)  # 128 CTAs would not all be resident
    assert plan.source == "grid.cu"
    assert "a hidden width of 1024 (it takes multiples of 128 up to 896: 8 units a CTA)" in plan.why


FAST_KERNELS = [
    ([784, 128, 128, 128, 10], SGD(lr=0.1), 32, {}),
    ([784, 256, 256, 256, 10], MOMENTUM, 32, {}),
    ([784, 512, 512, 512, 16], SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3), 7, {}),
    ([784, 1024, 1024, 1024, 10], SGD(lr=0.1), 32, {"tuning": Tuning(grid_profile=True)}),
    ([784, 768, 768, 768, 10], MOMENTUM, 32, {}),  # momentum in L2
    ([784, 256, 256, 256, 10], SGD(lr=0.1), 32, {"x_dtype": np.float32}),  # float32 rows staged as fp16
    ([784, 640, 640, 640, 10], MOMENTUM, 32, {"x_dtype": np.float32, "normalize": (0.1, 2.0)}),
    ([512, 256, 256, 256, 2], SGD(lr=0.1), 32, {"normalize": (0.5, 0.25)}),
]  # fmt: skip


@pytest.mark.bindings
@pytest.mark.parametrize("sizes,optimizer,batch,kw", FAST_KERNELS)
def test_the_fast_kernel_compiles(sizes, optimizer, batch, kw, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan(sizes, optimizer, "mixed", batch, **kw)
    assert isinstance(plan, gp.GridPlan) and plan.source == "grid_fast.cu", plan
    assert nvrtc.compile_native("grid_fast.cu", "sm_90", plan.options)[:4] == b"\x7fELF"


@pytest.mark.bindings
@pytest.mark.parametrize("name,message", [("GRID_SMEM", "shared-memory size is smaller"),
                                          ("GRID_SCRATCH", "global scratch is smaller")])  # fmt: skip
def test_an_undercounted_fast_plan_fails_to_compile(name, message, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, 256, 256, 256, 10])
    assert plan.source == "grid_fast.cu"
    value = int(_option(plan, name))
    options = [o if not o.startswith(f"-D{name}=") else f"-D{name}={value - 1}" for o in plan.options]
    with pytest.raises(Exception, match=message):
        nvrtc.compile_native("grid_fast.cu", "sm_90", options)


@pytest.mark.bindings
def test_a_scratch_that_does_not_fit_beside_the_training_set_is_a_data_error_naming_both():
    from fastnn import DataError
    from fastnn.engine.grid.engine import SYNC_BYTES, check_scratch_fits

    check_scratch_fits(1000, 1000 + SYNC_BYTES, 5_000_000)
    with pytest.raises(DataError, match=r"global scratch \(1,001 bytes\) does not fit in the GPU's free memory "
                                        r"\(1,256 bytes\) beside the training set \(5,000,000 bytes\)"):  # fmt: skip
        check_scratch_fits(1001, 1000 + SYNC_BYTES, 5_000_000)


@pytest.mark.bindings
def test_each_kernel_names_the_phases_its_profile_times():
    from fastnn.engine.grid.engine import GridTrainContext

    for sizes, kernel, phases in (([784, 256, 256, 256, 10], "grid_fast.cu", gp.FAST_PHASES),
                                  ([784, 256, 10], "grid.cu", gp.V1_PHASES)):  # fmt: skip
        ctx = GridTrainContext.__new__(GridTrainContext)
        ctx.plan = _plan(sizes, SGD(lr=0.1))
        assert ctx.plan.source == kernel and ctx.phase_names() == phases
    assert len(gp.V1_PHASES) == 10 and len(gp.FAST_PHASES) == 12  # the kernels' NPHASE
