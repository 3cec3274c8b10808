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
        # three equal layers the streaming kernel's units would fit (8448: 132 CTAs of 64): refused before it is asked
        ([784, 8448, 8448, 8448, 10], 32, gp.HOPPER_SMEM, "a layer of 8448 is wider than the grid kernel's 8192"),
        ([784, 8704, 8704, 8704, 10], 32, gp.HOPPER_SMEM, "a layer of 8704 is wider than the grid kernel's 8192"),
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
    # the streaming path (native/grid_stream.cu): wider than the fast path, uint8, plain SGD
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),
    ([784, 2048, 2048, 2048, 16], SGD(lr=0.05, weight_decay=1e-4), "mixed", np.uint8, 7, {}, "grid_stream.cu"),
    ([64, 4096, 4096, 4096, 2], SGD(lr=0.05), "mixed", np.uint8, 32, {"normalize": (0.0, 0.5)}, "grid_stream.cu"),
    ([784, 1280, 1280, 1280, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # 80 CTAs of 16
    ([784, 4096, 4096, 4096, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # momentum in HBM too
    ([784, 2048, 2048, 2048, 10], SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4), "mixed", np.uint8, 32,
     {}, "grid_stream.cu"),
    ([784, 4096, 4096, 4096, 10], AdamW(lr=1e-3), "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.float32, 32, {}, "grid.cu"),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {"normalize": (0.5, 0.25)}, "grid.cu"),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "fp32", np.uint8, 32, {}, "grid.cu"),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 64, {}, "grid.cu"),
    ([784, 8192, 8192, 8192, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # 128 CTAs of 64
    ([784, 8192, 8192, 8192, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 2112, 2112, 2112, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid.cu"),
    # an odd multiple of 128: only 64 units a CTA have a chunk (128) that divides it, so 18 CTAs; momentum: grid.cu
    ([784, 1152, 1152, 1152, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),
    ([784, 1152, 1152, 1152, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid.cu"),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {"tuning": Tuning(grid_fast=False)}, "grid.cu"),
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
    elif source == "grid_stream.cu":
        h = sizes[1]
        nb = next(n for n in gp.STREAM_UNITS if h % gp.stream_chunk(n) == 0 and h // n <= gp.HOPPER_SMS
                  and h // gp.stream_chunk(n) >= gp.STREAM_STAGES)  # fmt: skip
        assert (plan.function, plan.ctas, plan.units, plan.rounds) == ("grid_stream_kernel", h // nb, (nb,) * 3, 4)
        assert plan.phases == gp.STREAM_PHASES and plan.why.startswith("grid_stream.cu: ")
        n_state = len(optimizer.state_names)
        assert plan.smem_bytes == int(_option(plan, "GRID_SMEM")) == gp.stream_smem_bytes(sizes[0], h, nb, n_state)
        assert plan.scratch_bytes == int(_option(plan, "GRID_SCRATCH")) == gp.stream_scratch_bytes(sizes[0], h,
                                                                                                   n_state)  # fmt: skip
        assert _option(plan, "GRID_NS") == str(n_state)
        assert int(_option(plan, "GRID_P")) * nb == h
    else:
        assert plan.function == "grid_epoch_kernel" and plan.phases == gp.V1_PHASES
        assert plan.why.startswith("grid.cu (v1), not grid_fast.cu: ") and "; not grid_stream.cu: " in plan.why


def test_the_fast_path_stops_at_one_cta_per_sm():
    assert _plan([784, 1024, 1024, 1024, 10], SGD(lr=0.1)).source == "grid_fast.cu"
    plan = _plan([784, 1024, 1024, 1024, 10], AdamW(lr=1e-3), sms=120)  # 128 CTAs would not all be resident
    assert plan.source == "grid.cu"
    assert "a hidden width of 1024 (it takes multiples of 128 up to 896: 8 units a CTA)" in plan.why
    plan = _plan([784, 1024, 1024, 1024, 10], MOMENTUM, sms=120)  # momentum: the streaming path, 64 CTAs of 16
    assert (plan.source, plan.ctas) == ("grid_stream.cu", 64)


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


# ---- the streaming path (native/grid_stream.cu) ----------------------------------------------------------------------
PLAIN = SGD(lr=0.05)


def _stream(sizes, optimizer=PLAIN, precision="mixed", batch=32, x_dtype=np.uint8, sms=gp.HOPPER_SMS,
            smem=gp.HOPPER_SMEM, **kw):  # fmt: skip
    return gp.stream_plan(_cfg(sizes, optimizer, precision, batch, **kw), x_dtype, sms, smem)


H4 = [784, 4096, 4096, 4096, 10]


@pytest.mark.parametrize(
    "why,args,kw",
    [
        ("it is switched off (Tuning(grid_fast=False))", (H4,), {"tuning": Tuning(grid_fast=False)}),
        ("2 hidden layers (it trains three)", ([784, 4096, 4096, 10],), {}),
        ("hidden widths [4096, 2048, 4096] (it takes three equal ones)", ([784, 4096, 2048, 4096, 10],), {}),
        ("a hidden width of 2112 (it takes h / NB CTAs within the 132 SMs at NB = 16, 32 or 64 units a CTA, h a "
         "multiple of 256, or of 128 at 64, in at least 3 such chunks)", ([784, 2112, 2112, 2112, 10],), {}),
        ("a hidden width of 8192 (it takes h / NB CTAs within the 114 SMs at NB = 16, 32 or 64 units a CTA, h a "
         "multiple of 256, or of 128 at 64, in at least 3 such chunks)", ([784, 8192, 8192, 8192, 10],), {"sms": 114}),
        # 256 on a 16-SM slice (MIG): 16 CTAs of 16 would stream 1 chunk of 256, 4 of 64 two of 128, the ring needs 3
        ("a hidden width of 256 (it takes h / NB CTAs within the 16 SMs at NB = 16, 32 or 64 units a CTA, h a "
         "multiple of 256, or of 128 at 64, in at least 3 such chunks)", ([784, 256, 256, 256, 10],), {"sms": 16}),
        ("SGD momentum at 8192 (64 units a CTA: its buffers' registers would spill)", ([784, 8192, 8192, 8192, 10],
         MOMENTUM), {}),
        ("precision 'fp16' (it trains \"mixed\": fp32 masters, fp16 tensor-core operands)", (H4,),
         {"precision": "fp16"}),
        ("float32 inputs (it takes uint8 rows)", (H4,), {"x_dtype": np.float32}),
        ("activation 'gelu' (it takes relu)", (H4,), {"activation": "gelu"}),
        ("loss 'mse' (it computes softmax cross-entropy)", (H4,), {"loss": "mse"}),
        ("1040 input features (it takes multiples of 16 up to 1024)", ([1040, 4096, 4096, 4096, 10],), {}),
        ("100 input features (it takes multiples of 16 up to 1024)", ([100, 4096, 4096, 4096, 10],), {}),
        ("17 classes (it takes 2 to 16: one m16 tile of logits)", ([784, 4096, 4096, 4096, 17],), {}),
        ("batch size 33 (it takes up to 32 rows a step)", (H4,), {"batch": 33}),
        ("optimizer AdamW (it takes SGD, with or without momentum)", (H4, AdamW(lr=1e-3)), {}),
        ("a normalize shift of -2 (it takes a scale only)", (H4,), {"normalize": (0.5, 0.25)}),
        ("normalize is per-feature (it takes two numbers)", (H4,), {"normalize": (np.zeros(784), np.ones(784))}),
        ("it needs 204,648 bytes of shared memory per CTA, over the GPU's 200,000", (H4,), {"smem": 200_000}),
        ("it needs 207,144 bytes of shared memory per CTA, over the GPU's 205,000", (H4, MOMENTUM), {"smem": 205_000}),
    ],
)  # fmt: skip
def test_the_stream_plan_refuses_with_the_limit_named(why, args, kw):
    assert _stream(*args, **kw) == why


def test_the_stream_plan_takes_the_fewest_units_a_cta_that_fit_the_sms():
    assert _stream([784, 2048, 2048, 2048, 10]).units == (16, 16, 16)  # 128 CTAs
    assert _stream([784, 4096, 4096, 4096, 10]).units == (32, 32, 32)  # 256 CTAs of 16 would not be resident
    assert _stream([784, 2048, 2048, 2048, 10], sms=120).units == (32, 32, 32)  # 64 CTAs
    assert _stream([784, 8192, 8192, 8192, 10]).units == (64, 64, 64)  # 128 CTAs, 128-unit chunks
    assert _stream([784, 4096, 4096, 4096, 10], sms=114).units == (64, 64, 64)  # an H100 PCIe: 64 CTAs
    plan = _stream([784, 1152, 1152, 1152, 10])  # 256-unit chunks do not divide 1152: 64 units on 18 CTAs
    assert (plan.units, plan.ctas) == ((64, 64, 64), 18)
    # 512 on a 32-SM slice: 32 CTAs of 16 would stream 2 chunks of 256, fewer than the ring's 3 stages (the kernel's
    # static_assert): 8 CTAs of 64 stream 4 of 128
    assert _stream([784, 512, 512, 512, 10], sms=32).units == (64, 64, 64)


@pytest.mark.parametrize("sms", [16, 32, 64, 114, 132])
def test_every_stream_plan_has_a_chunk_for_each_ring_stage(sms):
    """native/grid_stream.cu issues STREAM_STAGES chunks before its first wait (static_assert NCH >= NST): no plan on
    any SM count gives it fewer."""
    for h in range(128, 8193, 128):
        plan = _stream([784, h, h, h, 10], sms=sms)
        if isinstance(plan, gp.GridPlan):
            assert h // gp.stream_chunk(plan.units[0]) >= gp.STREAM_STAGES, (h, sms, plan.units)


def test_the_stream_byte_mirrors_count_every_buffer():
    """stream_smem_bytes / stream_scratch_bytes against the layout written out by hand at h = 4096, d = 784."""
    smem = 2 * 32 * 784 + 3 * 256 * 32 * 2 + 3 * 32 * 256 * 2 + 8 * 32 * 40 * 4 + 4 * 32 * 32 * 2
    smem += (3 * 32 + 16 + 16 * 32 + 2 * 32 * 16) * 4 + 2 * 32 * 4 + 16 * 8 + 5 * 8
    assert gp.stream_smem_bytes(784, 4096, 32) == smem == 204_648
    masters = 4 * 4096 * 784 + 2 * 4 * 4096 * 4096
    w16, w3, exchange = 2 * 2 * 4096 * 4096, 2 * (2 * 2 * 4096 * 16), 4 * 2 * 4096 * 32
    assert gp.stream_scratch_bytes(784, 4096) == masters + w16 + w3 + exchange
    # momentum: its buffers of W0, W1, W2 beside the masters; its biases' / b3's / W3 slice's in shared memory
    assert gp.stream_scratch_bytes(784, 4096, 1) == 2 * masters + w16 + w3 + exchange
    assert gp.stream_smem_bytes(784, 4096, 32, 1) == smem + (3 * 32 + 16 + 16 * 32) * 4
    assert gp.stream_smem_bytes(784, 2048, 16) < gp.stream_smem_bytes(784, 4096, 32) <= gp.HOPPER_SMEM
    # 64 units a CTA: 128-unit chunks (three stages of 8 KB activations and 16 KB weights), sums [8][32][72]
    smem64 = 2 * 32 * 784 + 3 * 128 * 32 * 2 + 3 * 64 * 128 * 2 + 8 * 32 * 72 * 4 + 4 * 32 * 64 * 2
    smem64 += (3 * 64 + 16 + 16 * 64 + 2 * 32 * 16) * 4 + 2 * 32 * 4 + 16 * 8 + 5 * 8
    assert gp.stream_smem_bytes(784, 8192, 64) == smem64 == 223_464


STREAM_KERNELS = [
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), 32, {}),
    ([784, 2048, 2048, 2048, 16], SGD(lr=0.05, weight_decay=1e-4), 7, {"tuning": Tuning(grid_profile=True)}),
    ([64, 4096, 4096, 4096, 2], SGD(lr=0.05), 1, {"normalize": (0.0, 0.5)}),
    ([1024, 1280, 1280, 1280, 10], SGD(lr=0.05), 32, {}),
    ([784, 8192, 8192, 8192, 10], SGD(lr=0.05, weight_decay=1e-4), 32, {"tuning": Tuning(grid_profile=True)}),  # 64
    ([784, 4096, 4096, 4096, 10], MOMENTUM, 32, {"tuning": Tuning(grid_profile=True)}),  # momentum loaded per k-step
    ([784, 2048, 2048, 2048, 10], SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), 20, {}),  # chunk
]  # fmt: skip


@pytest.mark.bindings
@pytest.mark.parametrize("source,sizes,optimizer,batch,kw",
                         [("grid_fast.cu", *case) for case in FAST_KERNELS]
                         + [("grid_stream.cu", *case) for case in STREAM_KERNELS])  # fmt: skip
def test_the_tensor_core_kernels_compile(source, sizes, optimizer, batch, kw, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan(sizes, optimizer, "mixed", batch, **kw)
    assert isinstance(plan, gp.GridPlan) and plan.source == source, plan
    assert nvrtc.compile_native(source, "sm_90", plan.options)[:4] == b"\x7fELF"


@pytest.mark.bindings
@pytest.mark.parametrize("name,message", [("GRID_SMEM", "shared-memory size is smaller"),
                                          ("GRID_SCRATCH", "global scratch is smaller")])  # fmt: skip
@pytest.mark.parametrize("source,hidden,optimizer", [("grid_fast.cu", 256, MOMENTUM), ("grid_stream.cu", 4096, PLAIN),
                                                     ("grid_stream.cu", 4096, MOMENTUM),
                                                     ("grid_stream.cu", 8192, PLAIN),
                                                     ("grid_stream.cu", 2048, MOMENTUM)],
                         ids=["fast", "stream", "stream-momentum", "stream-64-units",
                              "stream-momentum-16-units"])  # fmt: skip
def test_an_undercounted_tensor_core_plan_fails_to_compile(name, message, source, hidden, optimizer, monkeypatch,
                                                           tmp_path):  # fmt: skip
    """The byte mirrors are exact: the kernel compiles with the plan's counts (above) and not with one byte less."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, hidden, hidden, hidden, 10], optimizer)
    assert plan.source == source
    value = int(_option(plan, name))
    options = [o if not o.startswith(f"-D{name}=") else f"-D{name}={value - 1}" for o in plan.options]
    with pytest.raises(Exception, match=message):
        nvrtc.compile_native(source, "sm_90", options)


@pytest.mark.bindings
def test_the_stream_kernel_refuses_to_compile_fewer_chunks_than_ring_stages(monkeypatch, tmp_path):
    """h = 512 on 32 SMs: the plan's 8 CTAs of 64 units (4 chunks of 128) compile; the same model on 32 CTAs of 16
    (2 chunks of 256, which the plan no longer gives) is refused by the kernel's static_assert."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _stream([784, 512, 512, 512, 10], sms=32)
    assert plan.ctas == 8 and nvrtc.compile_native("grid_stream.cu", "sm_90", plan.options)[:4] == b"\x7fELF"
    forced = {"GRID_P": 32, "GRID_SMEM": gp.stream_smem_bytes(784, 512, 16)}
    options = [next((f"-D{k}={v}" for k, v in forced.items() if o.startswith(f"-D{k}=")), o) for o in plan.options]
    with pytest.raises(Exception, match="at least NST chunks"):
        nvrtc.compile_native("grid_stream.cu", "sm_90", options)


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
                                  ([784, 4096, 4096, 4096, 10], "grid_stream.cu", gp.STREAM_PHASES),
                                  ([784, 256, 10], "grid.cu", gp.V1_PHASES)):  # fmt: skip
        ctx = GridTrainContext.__new__(GridTrainContext)
        ctx.plan = _plan(sizes, SGD(lr=0.1))
        assert ctx.plan.source == kernel and ctx.phase_names() == phases
    assert len(gp.V1_PHASES) == 10 and len(gp.FAST_PHASES) == len(gp.STREAM_PHASES) == 12  # the kernels' NPHASE
