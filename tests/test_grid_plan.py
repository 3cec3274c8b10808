"""The grid engine's plan on the CPU: the CTAs and the units each owns, the shared memory and global scratch the
kernels need, their refusals naming their limits (and engine='graph'), and the kernels compiled (NVRTC, sm_90) with
plans' options, where static_asserts check that the kernels' layouts need no more than the bytes the plan computed."""

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


@pytest.mark.parametrize("sizes,optimizer", [([784, 256, 256, 256, 10], MOMENTUM), ([784, 768, 768, 768, 10],
                                                                                     AdamW(lr=1e-3)),
                                              ([784, 4096, 4096, 4096, 10], SGD(lr=0.05)),
                                              ([784, 1152, 1152, 1152, 10], SGD(lr=0.05))])  # fmt: skip
@pytest.mark.parametrize("sms", [114, 132])
def test_every_unit_is_owned_by_exactly_one_cta_and_ctas_fit_the_sms(sizes, optimizer, sms):
    plan = _plan(sizes, optimizer, sms=sms)
    assert isinstance(plan, gp.GridPlan), plan
    assert 1 <= plan.ctas <= sms and len(plan.units) == 3 and plan.rounds == gp.rounds_per_step(3) == 4
    for width, nb in zip(sizes[1:-1], plan.units):
        assert nb * plan.ctas == width, (width, nb, plan.ctas)  # CTA p owns [p * nb, (p + 1) * nb)
    assert _option(plan, "GRID_P") == str(plan.ctas)
    assert plan.smem_bytes <= gp.HOPPER_SMEM and _option(plan, "GRID_SMEM") == str(plan.smem_bytes)
    assert plan.scratch_bytes <= gp.MAX_SCRATCH and _option(plan, "GRID_SCRATCH") == str(plan.scratch_bytes)


@pytest.mark.parametrize("hidden,rounds", [(1, 1), (2, 2), (3, 4), (4, 6), (6, 10)])
def test_rounds_per_step_are_the_forward_boundaries_plus_the_unshared_backward_ones(hidden, rounds):
    assert gp.rounds_per_step(hidden) == rounds


def test_logistic_regression_is_refused_by_name():
    assert _plan([784, 10]) == "no hidden layer to spread; use engine='fused' or 'graph'"


@pytest.mark.parametrize(
    "sizes,kw,expect",
    [
        ([784, 8193, 10], {}, "a layer of 8193 is wider than the grid kernels' 8192; use engine='graph'"),
        # three equal layers the streaming kernel's units would fit (8448: 132 CTAs of 64): refused before it is asked
        ([784, 8448, 8448, 8448, 10], {}, "a layer of 8448 is wider than the grid kernels' 8192; use engine='graph'"),
        # a limit both kernels share is said once
        ([784, 256, 256, 10], {}, "2 hidden layers (it trains three); use engine='graph'"),
        ([20, 37, 2], {}, "1 hidden layers (it trains three); use engine='graph'"),
        # each kernel's own limit is named where they differ
        ([784, 256, 256, 256, 10], {"precision": "fp32"},
         "grid_fast.cu: precision 'fp32' (it trains \"mixed\": fp32 masters, fp16 tensor-core operands); "
         "grid_stream.cu: a hidden width of 256 (it takes h / NB CTAs within the 132 SMs at NB = 16, 32 or 64 units a "
         "CTA, h a multiple of 256, or of 128 at 64, in at least 3 such chunks); use engine='graph'"),
        ([784, 4096, 4096, 4096, 10], {"optimizer": AdamW(lr=1e-3)},
         "grid_fast.cu: a hidden width of 4096 (it takes multiples of 128 up to 1024: 8 units a CTA); grid_stream.cu: "
         "optimizer AdamW (it takes SGD, with or without momentum); use engine='graph'"),
    ],
)  # fmt: skip
def test_a_model_neither_kernel_serves_is_refused_naming_each_limit_and_the_graph_engine(sizes, kw, expect):
    """grid.cu (version 1, 14-122x slower than the graph engine) no longer stands behind the fast kernels: whatever
    they do not serve is refused, and the reason says where to go."""
    assert _plan(sizes, **kw) == expect


@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), MOMENTUM, AdamW(lr=1e-3)], ids=["sgd", "momentum", "adamw"])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_every_refusal_names_the_graph_engine_and_float32_is_served_only_where_uint8_is(precision, optimizer,
                                                                                        x_dtype):  # fmt: skip
    """GridEngine.unsupported_reason asks of uint8 rows alone: every model served with float32 rows must be served
    with uint8 rows too."""
    for sizes in ([784, 256, 256, 256, 10], [784, 768, 768, 768, 10], [784, 1024, 1024, 10], [3, 8192, 2],
                  [784, 2048, 2048, 2048, 10], [64, 8192, 8192, 8192, 16], [30, 37, 37, 37, 37, 10]):  # fmt: skip
        for batch in (1, 32, 512):
            plan = _plan(sizes, optimizer, precision, batch, x_dtype=x_dtype)
            if isinstance(plan, str):
                assert plan.endswith("use engine='graph'") or "engine='fused' or 'graph'" in plan, plan
            elif x_dtype == np.float32:
                assert isinstance(_plan(sizes, optimizer, precision, batch), gp.GridPlan), (sizes, batch)


def test_a_regression_is_refused_by_name():
    reason = _plan([784, 256, 256, 256, 1], loss="mse")
    assert reason.startswith("grid_fast.cu: loss 'mse' (it computes softmax cross-entropy); grid_stream.cu: ")


def test_the_phase_profile_is_a_tuning_compiled_in_as_a_define():
    assert "-DGRID_PROFILE" not in _plan([784, 128, 128, 128, 10]).options
    assert _plan([784, 128, 128, 128, 10], tuning=Tuning(grid_profile=True)).options[-1] == "-DGRID_PROFILE"


def _device(cc=(9, 0), sms=132, smem=gp.HOPPER_SMEM):
    return types.SimpleNamespace(compute_capability=cc, sm_count=sms, max_shared_memory_optin=smem, name="GPU",
                                 arch=f"sm_{cc[0]}{cc[1]}")  # fmt: skip


@pytest.mark.bindings
@pytest.mark.parametrize(
    "sizes,kw,cc,expect",
    [
        ([784, 256, 256, 256, 10], {"data_placement": "host"}, (9, 0), "data_placement='host' needs engine='graph'"),
        ([784, 256, 256, 256, 10], {"normalize": (np.zeros(784), np.ones(784))}, (9, 0), "not per-feature vectors"),
        ([784, 256, 256, 256, 10], {}, (8, 0),
         "it needs cooperative launches and bulk copies (compute capability 9.0 or newer); GPU is sm_80"),
        ([784, 256, 256, 256, 10], {}, (9, 0), None),
        ([784, 256, 256, 256, 10], {"normalize": (0.5, 2.0)}, (9, 0), None),
        # float32 rows of 768 do not fit grid_fast.cu's shared memory, uint8 ones do: served (refused at fit)
        ([784, 768, 768, 768, 10], {}, (9, 0), None),
        ([20, 40, 3], {}, (9, 0), "1 hidden layers (it trains three); use engine='graph'"),
    ],
)  # fmt: skip
def test_the_engine_names_what_the_plan_cannot_see(sizes, kw, cc, expect):
    from fastnn.engine.grid import GridEngine

    reason = GridEngine.unsupported_reason(_cfg(sizes, **kw), _device(cc))
    assert reason == expect if expect is None else expect in reason


# ---- the fast path (native/grid_fast.cu) -----------------------------------------------------------------------------
# (sizes, optimizer, precision, x_dtype, batch, kwargs, the kernel the plan must pick, None: refused)
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
    ([784, 768, 768, 768, 10], SGD(lr=0.1), "mixed", np.float32, 32, {}, None),  # fp16 rows: > 227 KB
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "fp32", np.uint8, 32, {}, None),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "fp16", np.uint8, 32, {}, None),
    ([784, 256, 256, 256, 10], AdamW(lr=1e-3), "mixed", np.uint8, 32, {}, "grid_fast.cu"),  # moments on chip
    ([784, 512, 512, 512, 10], AdamW(lr=1e-3, weight_decay=0.01), "mixed", np.uint8, 8, {}, "grid_fast.cu"),  # in L2
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 33, {}, None),
    ([784, 256, 256, 256, 17], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([784, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([784, 256, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([784, 256, 512, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([784, 192, 192, 192, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([785, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {}, None),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {"activation": "gelu"}, None),
    ([784, 256, 256, 256, 10], SGD(lr=0.1), "mixed", np.uint8, 32, {"loss": "mse"}, None),
    # the streaming path (native/grid_stream.cu): wider than the fast path, uint8, plain SGD
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),
    ([784, 2048, 2048, 2048, 16], SGD(lr=0.05, weight_decay=1e-4), "mixed", np.uint8, 7, {}, "grid_stream.cu"),
    ([64, 4096, 4096, 4096, 2], SGD(lr=0.05), "mixed", np.uint8, 32, {"normalize": (0.0, 0.5)}, "grid_stream.cu"),
    ([784, 1280, 1280, 1280, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # 80 CTAs of 16
    ([784, 4096, 4096, 4096, 10], MOMENTUM, "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # momentum in HBM too
    ([784, 2048, 2048, 2048, 10], SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4), "mixed", np.uint8, 32,
     {}, "grid_stream.cu"),
    ([784, 4096, 4096, 4096, 10], AdamW(lr=1e-3), "mixed", np.uint8, 32, {}, None),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.float32, 32, {}, None),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {"normalize": (0.5, 0.25)}, None),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "fp32", np.uint8, 32, {}, None),
    ([784, 4096, 4096, 4096, 10], SGD(lr=0.05), "mixed", np.uint8, 64, {}, None),
    ([784, 8192, 8192, 8192, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),  # 128 CTAs of 64
    ([784, 8192, 8192, 8192, 10], MOMENTUM, "mixed", np.uint8, 32, {}, None),
    ([784, 2112, 2112, 2112, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, None),
    # an odd multiple of 128: only 64 units a CTA have a chunk (128) that divides it, so 18 CTAs; momentum: refused
    ([784, 1152, 1152, 1152, 10], SGD(lr=0.05), "mixed", np.uint8, 32, {}, "grid_stream.cu"),
    ([784, 1152, 1152, 1152, 10], MOMENTUM, "mixed", np.uint8, 32, {}, None),
]  # fmt: skip


@pytest.mark.parametrize("sizes,optimizer,precision,x_dtype,batch,kw,source", CHOICES)
def test_the_plan_picks_the_fast_kernel_exactly_where_it_serves(sizes, optimizer, precision, x_dtype, batch, kw,
                                                                 source):  # fmt: skip
    plan = _plan(sizes, optimizer, precision, batch, x_dtype=x_dtype, **kw)
    if source is None:
        assert isinstance(plan, str) and plan.endswith("; use engine='graph'"), plan
        return
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
        raise AssertionError(source)


def test_the_fast_path_stops_at_one_cta_per_sm():
    assert _plan([784, 1024, 1024, 1024, 10], SGD(lr=0.1)).source == "grid_fast.cu"
    plan = _plan([784, 1024, 1024, 1024, 10], AdamW(lr=1e-3), sms=120)  # 128 CTAs would not all be resident
    assert "a hidden width of 1024 (it takes multiples of 128 up to 896: 8 units a CTA)" in plan
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
                                  ([784, 4096, 4096, 4096, 10], "grid_stream.cu", gp.STREAM_PHASES)):  # fmt: skip
        ctx = GridTrainContext.__new__(GridTrainContext)
        ctx.plan = _plan(sizes, SGD(lr=0.1))
        assert ctx.plan.source == kernel and ctx.phase_names() == phases
    assert len(gp.FAST_PHASES) == len(gp.STREAM_PHASES) == 12  # the kernels' NPHASE
