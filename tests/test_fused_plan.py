"""The fused engine's plan on the CPU: which models it holds, the refusal naming the bytes, and the kernel
compiled (NVRTC, sm_90) with each plan's options, where a static_assert checks that the kernel's shared-memory
layout needs no more than the bytes the plan computed."""

from __future__ import annotations

import numpy as np
import pytest

from fastnn import MLP, SGD, AdamW
from fastnn.cuda import nvrtc
from fastnn.engine import Tuning
from fastnn.engine.base import EngineConfig
from fastnn.engine.fused import plan as fp

MOMENTUM = SGD(lr=0.01, momentum=0.9)


def _plan(sizes, optimizer=MOMENTUM, precision="mixed", batch=32, x_dtype=np.float32, tuning=None,
          loss="cross_entropy"):  # fmt: skip
    cfg = EngineConfig(model=MLP(sizes), optimizer=optimizer, batch_size=batch, precision=precision,
                       tuning=tuning or Tuning(), loss=loss)  # fmt: skip
    return fp.fused_plan(cfg, x_dtype)


def _option(plan: fp.FusedPlan, name: str) -> str:
    (value,) = [o.split("=", 1)[1] for o in plan.options if o.startswith(f"-D{name}=")]
    return value


@pytest.mark.parametrize("classes", [2, 10, 100])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), MOMENTUM, AdamW(lr=1e-3)], ids=["sgd", "momentum", "adamw"])
@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
def test_logistic_regression_up_to_100_classes_is_held(classes, optimizer, precision):
    for batch in (1, 128, 1000):
        plan = _plan([784, classes], optimizer, precision, batch)
        assert isinstance(plan, fp.FusedPlan), plan
        assert plan.smem_bytes <= fp.HOPPER_SMEM


@pytest.mark.parametrize("width", [64, 128, 192, 256])
@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
def test_three_hidden_layers_up_to_256_with_momentum_are_held(width, precision):
    for batch in (32, 128):
        plan = _plan([784, width, width, width, 10], MOMENTUM, precision, batch)
        assert isinstance(plan, fp.FusedPlan), plan


def test_256_wide_takes_the_lean_layout_and_128_the_standard_one():
    lean = _plan([784, 256, 256, 256, 10])
    assert (_option(lean, "FUSED_FOLD"), _option(lean, "FUSED_OPC")) == ("1", "0")
    standard = _plan([784, 128, 128, 128, 10])
    assert (_option(standard, "FUSED_FOLD"), _option(standard, "FUSED_OPC")) == ("0", "1")
    # Nesterov's step needs the gradient beside the buffer: never folded.
    nesterov = _plan([784, 192, 192, 10], SGD(lr=0.01, momentum=0.9, nesterov=True))
    assert isinstance(nesterov, fp.FusedPlan) and _option(nesterov, "FUSED_FOLD") == "0"


@pytest.mark.parametrize(
    "sizes,optimizer,arrays",
    [
        ([784, 320, 320, 320, 10], MOMENTUM, "(weights and optimizer state of"),
        ([784, 256, 256, 256, 10], AdamW(lr=1e-3), "weights, gradients and optimizer state"),
        ([784, 256, 256, 256, 10], SGD(lr=0.01, momentum=0.9, nesterov=True), "weights, gradients and optimizer"),
    ],
)
def test_a_model_too_big_is_refused_naming_bytes_and_what_is_held(sizes, optimizer, arrays):
    reason = _plan(sizes, optimizer)
    assert isinstance(reason, str)
    assert "bytes of shared memory per CTA" in reason and "232,448" in reason and arrays in reason, reason


@pytest.mark.parametrize(
    "precision,batch,mma", [("mixed", 128, "1"), ("fp16", 32, "1"), ("fp32", 128, "0"), ("mixed", 8, "0")]
)
def test_tensor_cores_for_half_operands_in_chunks_of_16_rows_or_more(precision, batch, mma):
    plan = _plan([784, 10], MOMENTUM, precision, batch, np.uint8, Tuning(fused_logreg=False))
    assert _option(plan, "FUSED_MMA") == mma, (plan.rows, plan.options)
    fma = _plan([784, 10], MOMENTUM, precision, batch, np.uint8, Tuning(tensor_cores=False, fused_logreg=False))
    assert _option(fma, "FUSED_MMA") == "0"


def test_a_lean_only_tuning_takes_the_lean_layout_where_the_standard_one_fits():
    lean = _plan([784, 128, 128, 128, 10], tuning=Tuning(fused_layouts=("lean",)))
    assert (_option(lean, "FUSED_FOLD"), _option(lean, "FUSED_OPC")) == ("1", "0")


@pytest.mark.bindings
def test_the_phase_profile_is_a_tuning_compiled_in_as_a_define(monkeypatch, tmp_path):
    """Tuning.fused_profile (bench_fused.py --phases) adds -DFUSED_PROFILE to the plan's options, and the kernel
    compiles with it; by default the plan carries no such define."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    assert "-DFUSED_PROFILE" not in _plan([784, 10]).options
    plan = _plan([784, 128, 10], tuning=Tuning(fused_profile=True))
    assert plan.options[-1] == "-DFUSED_PROFILE"
    assert nvrtc.compile_native("fused.cu", "sm_90", plan.options)[:4] == b"\x7fELF"


def test_a_model_accepted_for_float_inputs_fits_uint8_inputs_too():
    for sizes in ([784, 224, 224, 10], [784, 256, 256, 256, 10], [784, 100]):
        for opt in (MOMENTUM, SGD(lr=0.01, momentum=0.9, nesterov=True), AdamW(lr=1e-3)):
            f32, u8 = _plan(sizes, opt, x_dtype=np.float32), _plan(sizes, opt, x_dtype=np.uint8)
            if isinstance(f32, fp.FusedPlan):
                assert isinstance(u8, fp.FusedPlan) and u8.smem_bytes <= f32.smem_bytes


def test_the_smallest_limit_forces_a_refusal_not_a_zero_row_plan():
    reason = fp.fused_plan(
        EngineConfig(model=MLP([784, 10]), optimizer=MOMENTUM, batch_size=32, precision="mixed"), np.uint8, 1024
    )
    assert isinstance(reason, str) and "4 rows per chunk" in reason


# One kernel per layout, precision, optimizer kind and input type: the static_assert in fused.cu fails to compile
# if make_layout() needs more than FUSED_SMEM, i.e. if smem_floats() here ever undercounts.
KERNELS = [
    ([784, 10], MOMENTUM, "mixed", np.uint8, "standard"),
    ([784, 100], AdamW(lr=1e-3), "fp32", np.float32, "standard"),
    ([784, 128, 128, 128, 10], SGD(lr=0.01, momentum=0.9, nesterov=True), "mixed", np.uint8, "standard"),
    ([784, 256, 256, 256, 10], MOMENTUM, "mixed", np.uint8, "lean"),
    ([784, 256, 256, 256, 10], SGD(lr=0.01), "fp16", np.float32, "lean"),
    ([30, 37, 37, 10], AdamW(lr=1e-3), "mixed", np.float32, "lean"),
    ([784, 128, 128, 128, 10], SGD(lr=0.1), "fp16", np.uint8, "standard"),  # tensor cores, K split across warps
]


@pytest.mark.bindings
@pytest.mark.parametrize("sizes,optimizer,precision,x_dtype,layout", KERNELS)
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["mma", "fma"])
def test_the_kernel_compiles_for_each_layout(
    sizes, optimizer, precision, x_dtype, layout, tensor_cores, monkeypatch, tmp_path
):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    tuning = Tuning(fused_layouts=(layout,), tensor_cores=tensor_cores, fused_logreg=False,
                    fused_mlp=False)
    plan = _plan(sizes, optimizer, precision, 32, x_dtype, tuning)
    assert isinstance(plan, fp.FusedPlan) and plan.source == "fused.cu", plan
    cubin = nvrtc.compile_native("fused.cu", "sm_90", plan.options)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.bindings
def test_an_undercounted_plan_fails_to_compile(monkeypatch, tmp_path):
    """The cross-check above can fail: a plan claiming one 4-byte word too few is rejected by the compiler."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, 256, 256, 256, 10])
    options = [o if not o.startswith("-DFUSED_SMEM=") else f"-DFUSED_SMEM={plan.smem_bytes - 4}" for o in plan.options]
    with pytest.raises(Exception, match="shared-memory size is smaller"):
        nvrtc.compile_native("fused.cu", "sm_90", options)


# ---- a regression (loss "mse"): the same layout (its rows carry sample indices where labels were), its own head ----


@pytest.mark.parametrize("sizes", [[784, 10], [30, 37, 37, 1], [784, 256, 256, 256, 10]])
def test_a_regression_is_held_with_the_classifiers_shared_memory(sizes):
    fused_cu = Tuning(fused_logreg=False)  # a classifier [784, 10] would take fused_logreg.cu
    clf, reg = _plan(sizes, tuning=fused_cu), _plan(sizes, loss="mse")
    assert isinstance(reg, fp.FusedPlan), reg
    assert (reg.rows, reg.smem_bytes) == (clf.rows, clf.smem_bytes)
    assert (_option(clf, "FUSED_LOSS"), _option(reg, "FUSED_LOSS")) == ("0", "1")
    assert [o for o in reg.options if "FUSED_LOSS" not in o] == [o for o in clf.options if "FUSED_LOSS" not in o]


@pytest.mark.bindings
@pytest.mark.parametrize(
    "sizes,optimizer,precision,x_dtype,layout",
    [
        ([784, 10], MOMENTUM, "mixed", np.uint8, "standard"),
        ([30, 37, 37, 1], AdamW(lr=1e-3), "fp32", np.float32, "standard"),
        ([784, 128, 128, 128, 10], SGD(lr=0.1), "fp16", np.uint8, "standard"),
        ([784, 256, 256, 256, 10], MOMENTUM, "mixed", np.float32, "lean"),
    ],
)
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["mma", "fma"])
def test_the_regression_kernel_compiles(sizes, optimizer, precision, x_dtype, layout, tensor_cores, monkeypatch,
                                        tmp_path):  # fmt: skip
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    tuning = Tuning(fused_layouts=(layout,), tensor_cores=tensor_cores, fused_logreg=False,
                    fused_mlp=False)
    plan = _plan(sizes, optimizer, precision, 32, x_dtype, tuning, loss="mse")
    assert isinstance(plan, fp.FusedPlan), plan
    cubin = nvrtc.compile_native("fused.cu", "sm_90", plan.options)
    assert cubin[:4] == b"\x7fELF"
    classifier = _plan(sizes, optimizer, precision, 32, x_dtype, tuning)
    assert cubin != nvrtc.compile_native("fused.cu", "sm_90", classifier.options)  # the regression's head is in it


# ---- native/fused_logreg.cu: which logistic regressions it serves, why the others go to fused.cu ----------------


@pytest.mark.parametrize("features,cluster", [(20, 1), (256, 1), (257, 2), (512, 2), (513, 4), (784, 4), (1024, 4),
                                              (1025, 8), (2048, 8), (2049, None)])  # fmt: skip
def test_the_logreg_cluster_is_the_smallest_with_at_most_16_chunks_a_cta(features, cluster):
    assert fp.logreg_cluster(features) == cluster


@pytest.mark.parametrize("classes", [2, 3, 10, 16])
@pytest.mark.parametrize("batch", [1, 17, 100, 128])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), MOMENTUM, AdamW(lr=1e-3)], ids=["sgd", "momentum", "adamw"])
@pytest.mark.parametrize("precision", ["mixed", "fp16"])
def test_uint8_logistic_regression_takes_the_logreg_kernel(classes, batch, optimizer, precision):
    plan = _plan([784, classes], optimizer, precision, batch, np.uint8)
    assert (plan.source, plan.function, plan.threads) == ("fused_logreg.cu", "fused_logreg_kernel", 384)
    assert plan.cluster == 4 and plan.rows == -(-batch // 16) * 16
    assert plan.smem_bytes <= fp.HOPPER_SMEM and plan.why.startswith("fused_logreg.cu: 784 features in 49 chunks")
    assert _option(plan, "LR_C") == str(classes) and _option(plan, "LR_NS") == str(len(optimizer.state_names))
    assert _option(plan, "LR_ST") == "4"  # every case here has room for 4 gather stages


@pytest.mark.parametrize(
    "sizes,precision,batch,x_dtype,kw,reason",
    [
        ([784, 10], "mixed", 128, np.float64, {}, "float64 inputs"),
        ([784, 10], "fp32", 128, np.uint8, {}, "precision 'fp32'"),
        ([784, 10], "mixed", 128, np.uint8, {"loss": "mse"}, "loss 'mse'"),
        ([784, 17], "mixed", 128, np.uint8, {}, "17 classes"),
        ([784, 10], "mixed", 129, np.uint8, {}, "batch size 129"),
        ([2049, 10], "mixed", 32, np.uint8, {}, "2049 features"),
        ([784, 10], "mixed", 32, np.uint8, {"tuning": Tuning(fused_logreg=False)}, "Tuning(fused_logreg=False)"),
    ],
)
def test_the_rest_goes_to_fused_cu_saying_why(sizes, precision, batch, x_dtype, kw, reason):
    plan = _plan(sizes, MOMENTUM, precision, batch, x_dtype, **kw)
    assert isinstance(plan, fp.FusedPlan) and plan.source == "fused.cu" and plan.function == "fused_epoch_kernel"
    assert plan.why.startswith("fused.cu, not fused_logreg.cu: ") and reason in plan.why, plan.why
    assert isinstance(fp.logreg_plan(EngineConfig(model=MLP(sizes), optimizer=MOMENTUM, batch_size=batch,
                                                  precision=precision, **kw), x_dtype), str)  # fmt: skip


def test_each_cluster_kernel_declines_the_others_models():
    mlp = EngineConfig(model=MLP([784, 64, 10]), optimizer=MOMENTUM, batch_size=32, precision="mixed")
    logreg = EngineConfig(model=MLP([784, 10]), optimizer=MOMENTUM, batch_size=32, precision="mixed")
    assert "the model has a hidden layer" in fp.logreg_plan(mlp, np.uint8)
    assert "0 hidden layers" in fp.mlp_plan(logreg, np.uint8)
    assert fp.fused_plan(mlp, np.uint8).source == "fused_mlp.cu"
    assert fp.fused_plan(logreg, np.uint8).source == "fused_logreg.cu"


def test_the_logreg_kernel_drops_gather_stages_then_declines_where_shared_memory_is_short():
    # 1024 features on 4 CTAs, 16 classes, AdamW: 264,656 bytes with 4 stages, 228,784 with 3, 192,912 with 2
    cfg = EngineConfig(model=MLP([1024, 16]), optimizer=AdamW(lr=1e-3), batch_size=128, precision="mixed")
    plans = [fp.logreg_plan(cfg, np.uint8, limit) for limit in (232448, 228784, 228783, 192912)]
    assert [_option(p, "LR_ST") for p in plans] == ["3", "3", "2", "2"]
    assert [p.smem_bytes for p in plans] == [228784, 228784, 192912, 192912]
    reason = fp.logreg_plan(cfg, np.uint8, 192911)
    assert isinstance(reason, str) and "bytes of shared memory per CTA even with 2 stages" in reason
    fallback = fp.fused_plan(cfg, np.uint8, 192911)  # fused.cu then, or its own refusal naming the bytes
    assert isinstance(fallback, str) or fallback.source == "fused.cu"


def test_a_nonzero_shift_and_the_row_copy_width_are_compiled_in():
    def opts(sizes, normalize=None, x_dtype=np.uint8):
        cfg = EngineConfig(model=MLP(sizes), optimizer=MOMENTUM, batch_size=64, precision="mixed", normalize=normalize)
        plan = fp.logreg_plan(cfg, x_dtype)
        return _option(plan, "LR_SHIFT"), _option(plan, "LR_G"), _option(plan, "LR_XF")

    assert opts([784, 10]) == ("0", "16", "0")
    assert opts([784, 10], (0.0, 2.0)) == ("0", "16", "0")  # x / 255 / 2: a scale only
    assert opts([784, 10], (0.3, 0.5)) == ("1", "16", "0")
    assert opts([100, 10]) == ("0", "4", "0") and opts([40, 10]) == ("0", "8", "0")
    assert opts([50, 10]) == ("0", "1", "0")
    # float32 rows are converted by the producers, shift included: no column sums
    assert opts([784, 10], (0.3, 0.5), np.float32) == ("0", "16", "1")


def test_float32_rows_take_twice_the_stage_bytes_and_fewer_stages():
    cfg = EngineConfig(model=MLP([784, 10]), optimizer=MOMENTUM, batch_size=128, precision="mixed")
    u8, f32 = fp.logreg_plan(cfg, np.uint8), fp.logreg_plan(cfg, np.float32)
    assert (u8.source, f32.source) == ("fused_logreg.cu", "fused_logreg.cu")
    assert (_option(u8, "LR_ST"), _option(f32, "LR_ST")) == ("4", "3")
    # 128 rows of 13 chunks: uint8 208 bytes a row, fp16 13 * 32 + 16 = 432; a stage fewer: its labels, indices
    # (512 bytes each), step constants (16) and two mbarriers (16)
    assert f32.smem_bytes - u8.smem_bytes == 3 * 128 * 432 - 4 * 128 * 208 - 512 - 512 - 16 - 16


# One kernel per cluster size, copy width, precision, optimizer, shift and batch: the static_assert in
# fused_logreg.cu fails to compile if its layout needs more than LR_SMEM, i.e. if logreg_smem_bytes undercounts.
LOGREG_KERNELS = [
    ([784, 10], MOMENTUM, "mixed", 128, None),
    ([784, 10], SGD(lr=0.1), "mixed", 128, None),
    ([784, 10], AdamW(lr=1e-3), "mixed", 128, (0.3, 0.5)),
    ([784, 16], SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4), "fp16", 100, None),
    ([784, 3], AdamW(lr=1e-3), "fp16", 1, None),
    ([100, 7], MOMENTUM, "mixed", 64, (0.5, 0.25)),
    ([50, 15], AdamW(lr=1e-3), "mixed", 48, None),
    ([40, 2], SGD(lr=0.1), "mixed", 16, None),
    ([300, 10], MOMENTUM, "mixed", 128, None),
    ([2048, 10], AdamW(lr=1e-3), "mixed", 128, None),  # 8 CTAs, 2 gather stages
]
#: float32 rows (the producers convert them): aligned and unaligned widths, a shift
LOGREG_FLOAT_KERNELS = [
    ([784, 10], MOMENTUM, "mixed", 128, (0.3, 0.5)),
    ([30, 5], AdamW(lr=1e-3), "fp16", 32, None),
]


@pytest.mark.bindings
@pytest.mark.parametrize(
    "sizes,optimizer,precision,batch,normalize,x_dtype",
    [(*k, np.uint8) for k in LOGREG_KERNELS] + [(*k, np.float32) for k in LOGREG_FLOAT_KERNELS],
)
def test_the_logreg_kernel_compiles(sizes, optimizer, precision, batch, normalize, x_dtype, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    cfg = EngineConfig(model=MLP(sizes), optimizer=optimizer, batch_size=batch, precision=precision,
                       normalize=normalize)  # fmt: skip
    plan = fp.fused_plan(cfg, x_dtype)
    assert plan.source == "fused_logreg.cu", plan.why
    assert nvrtc.compile_native(plan.source, "sm_90", plan.options)[:4] == b"\x7fELF"


@pytest.mark.bindings
def test_an_undercounted_logreg_plan_fails_to_compile_and_the_profile_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    plan = _plan([784, 10], MOMENTUM, "mixed", 128, np.uint8)
    options = [o if not o.startswith("-DLR_SMEM=") else f"-DLR_SMEM={plan.smem_bytes - 16}" for o in plan.options]
    with pytest.raises(Exception, match="shared-memory size is smaller"):
        nvrtc.compile_native("fused_logreg.cu", "sm_90", options)
    profiled = _plan([784, 10], MOMENTUM, "mixed", 128, np.uint8, Tuning(fused_profile=True))
    assert profiled.source == "fused_logreg.cu" and profiled.options[-1] == "-DFUSED_PROFILE"
    assert nvrtc.compile_native("fused_logreg.cu", "sm_90", profiled.options)[:4] == b"\x7fELF"


# ---- native/fused_mlp.cu: narrow MLPs at small batches ---------------------------------------------------------


@pytest.mark.parametrize("hidden,cluster", [((16,), 1), ((37,), 4), ((17, 32), 2), ((64,), 4), ((128, 128, 128), 8),
                                            ((129,), None)])  # fmt: skip
def test_the_mlp_cluster_gives_every_cta_16_neurons_of_each_hidden_layer(hidden, cluster):
    assert fp.mlp_cluster(hidden) == cluster


@pytest.mark.parametrize("precision", ["mixed", "fp16"])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), MOMENTUM, SGD(lr=0.1, momentum=0.9, nesterov=True)])
def test_narrow_mlps_at_small_batches_take_the_mlp_kernel(precision, optimizer):
    for sizes, batch, cluster in (([784, 128, 128, 128, 10], 32, 8), ([784, 64, 10], 1, 4), ([20, 16, 2], 20, 1)):
        plan = _plan(sizes, optimizer, precision, batch, np.uint8)
        assert (plan.source, plan.function, plan.threads, plan.cluster) == ("fused_mlp.cu", "fused_mlp_kernel", 288,
                                                                           cluster), plan.why  # fmt: skip
        assert plan.smem_bytes <= fp.HOPPER_SMEM and plan.why.startswith("fused_mlp.cu: ")


@pytest.mark.parametrize(
    "sizes,optimizer,precision,batch,x_dtype,kw,reason",
    [
        ([784, 128, 10], AdamW(lr=1e-3), "mixed", 32, np.uint8, {}, "AdamW"),
        ([784, 256, 10], MOMENTUM, "mixed", 32, np.uint8, {}, "a hidden layer of 256"),
        ([784, 128, 10], MOMENTUM, "mixed", 64, np.uint8, {}, "batch size 64"),
        ([784, 128, 10], MOMENTUM, "fp32", 32, np.uint8, {}, "precision 'fp32'"),
        ([784, 128, 10], MOMENTUM, "mixed", 32, np.float32, {}, "float32 inputs"),
        ([784, 128, 33], MOMENTUM, "mixed", 32, np.uint8, {}, "33 classes"),
        ([784, 128, 10], MOMENTUM, "mixed", 32, np.uint8, {"normalize": (0.5, 0.25)}, "nonzero shift"),
        ([784, 128, 10], MOMENTUM, "mixed", 32, np.uint8, {"loss": "mse"}, "loss 'mse'"),
        ([784, 128, 10], MOMENTUM, "mixed", 32, np.uint8, {"tuning": Tuning(fused_mlp=False)}, "fused_mlp=False"),
    ],
)
def test_the_other_mlps_go_to_fused_cu_saying_why(sizes, optimizer, precision, batch, x_dtype, kw, reason):
    cfg = EngineConfig(model=MLP(sizes), optimizer=optimizer, batch_size=batch, precision=precision, **kw)
    plan = fp.fused_plan(cfg, x_dtype)
    assert isinstance(plan, fp.FusedPlan) and plan.source == "fused.cu", plan
    assert plan.why.startswith("fused.cu, not fused_mlp.cu: ") and reason in plan.why, plan.why


MLP_KERNELS = [
    ([784, 128, 128, 128, 10], MOMENTUM, "mixed", 32, "relu"),
    ([784, 128, 128, 128, 10], SGD(lr=0.1), "fp16", 32, "gelu"),
    ([20, 37, 2], SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), "mixed", 32, "relu"),
    ([30, 37, 37, 37, 37, 10], SGD(lr=0.05, momentum=0.5), "fp16", 32, "gelu"),
    ([50, 16, 16, 3], MOMENTUM, "mixed", 20, "relu"),
    ([784, 64, 16], SGD(lr=0.1), "mixed", 1, "relu"),
]


@pytest.mark.bindings
@pytest.mark.parametrize("sizes,optimizer,precision,batch,activation", MLP_KERNELS)
def test_the_mlp_kernel_compiles_and_its_layout_is_counted_exactly(sizes, optimizer, precision, batch, activation,
                                                                   monkeypatch, tmp_path):  # fmt: skip
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path))
    cfg = EngineConfig(model=MLP(sizes, activation=activation), optimizer=optimizer, batch_size=batch,
                       precision=precision)  # fmt: skip
    plan = fp.fused_plan(cfg, np.uint8)
    assert plan.source == "fused_mlp.cu", plan.why
    assert nvrtc.compile_native(plan.source, "sm_90", plan.options)[:4] == b"\x7fELF"
    options = [o if not o.startswith("-DMP_SMEM=") else f"-DMP_SMEM={plan.smem_bytes - 16}" for o in plan.options]
    with pytest.raises(Exception, match="shared-memory size is smaller"):
        nvrtc.compile_native(plan.source, "sm_90", options)
