"""The optimizer as the kernels take it: fastnn._optim's KernelParams, native/optim.cuh's OptimParams and the one
packer between them (driver.arg_struct); every optimizer class covered, the layouts equal, the engines free of
optimizer-specific code. CPU only (the `bindings` tests need the CUDA wheels, no GPU)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest

import fastnn._optim as optim
from fastnn import MLP
from fastnn._errors import ConfigError
from fastnn.engine import Tuning
from fastnn.engine.base import EngineConfig
from fastnn.engine.fused.plan import fused_plan

REPO = Path(__file__).resolve().parent.parent
#: One instance of every optimizer, each field away from its default where it has one.
EXAMPLES = {
    optim.SGD: optim.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True, bias_decay=0.0),
    optim.AdamW: optim.AdamW(lr=2e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, bias_decay=0.02),
}


def _optimizer_classes() -> set[type]:
    """Every optimizer class fastnn._optim defines (a dataclass with state_names)."""
    return {
        c for c in vars(optim).values()
        if isinstance(c, type) and c.__module__ == optim.__name__ and hasattr(c, "state_names")
    }  # fmt: skip


def test_every_optimizer_class_is_listed_and_packed():
    assert set(optim.OPTIMIZERS) == _optimizer_classes() == set(typing.get_args(optim.Optimizer)) == set(EXAMPLES)
    kinds = {}
    for cls in optim.OPTIMIZERS:
        params = EXAMPLES[cls].kernel_params()
        assert type(params) is optim.KernelParams, cls
        kinds[params.kind] = cls
        fields = params.c_fields()
        assert [name for name, _, _ in fields] == [f.name for f in dataclasses.fields(optim.KernelParams)]
        assert all(ctype in ("i32", "f32") for _, ctype, _ in fields)
        assert all(isinstance(v, int) if t == "i32" else isinstance(v, float) for _, t, v in fields), fields
    assert len(kinds) == len(optim.OPTIMIZERS)  # each class its own kind
    assert sorted(kinds) == sorted(v for k, v in vars(optim).items() if k.startswith("KIND_"))


def test_kernel_params_carry_each_optimizers_fields():
    sgd, adamw = EXAMPLES[optim.SGD].kernel_params(), EXAMPLES[optim.AdamW].kernel_params()
    assert sgd == optim.KernelParams(optim.KIND_SGD, momentum=0.9, weight_decay=1e-3, nesterov=1, bias_decay=0.0)
    assert adamw == optim.KernelParams(optim.KIND_ADAMW, weight_decay=0.1, beta1=0.8, beta2=0.99, eps=1e-6,
                                       bias_decay=0.02)  # fmt: skip
    assert optim.SGD().kernel_params() == optim.KernelParams(optim.KIND_SGD)  # unused fields are zero
    # bias_decay=None (the default): the biases decay as the weights, PyTorch's one parameter group
    assert optim.SGD(weight_decay=1e-3).kernel_params().bias_decay == 1e-3
    assert optim.AdamW().kernel_params().bias_decay == 0.01


def test_fused_plan_compiles_for_the_optimizers_kind_and_state():
    for opt in EXAMPLES.values():
        # fused.cu's options (fused_mlp.cu, which would take this model with SGD, is held off: it has no FUSED_OPT)
        cfg = EngineConfig(model=MLP([784, 32, 10]), optimizer=opt, batch_size=32, precision="mixed",
                           tuning=Tuning(fused_mlp=False))  # fmt: skip
        plan = fused_plan(cfg, np.uint8)
        assert not isinstance(plan, str), plan
        assert f"-DFUSED_OPT={opt.kernel_params().kind}" in plan.options
        assert f"-DFUSED_NS={len(opt.state_names)}" in plan.options


def _engine_sources() -> list[Path]:
    """The GPU engines' modules: everything under fastnn/engine but the NumPy engine (which runs each optimizer's
    NumPy step, so it names them)."""
    return sorted(p for p in (REPO / "fastnn" / "engine").rglob("*.py") if p.name != "numpy_engine.py")


@pytest.mark.parametrize("path", [str(p.relative_to(REPO)) for p in _engine_sources()])
def test_gpu_engines_know_no_optimizer_by_name(path):
    """They pass `kernel_params()` on and read `state_names`: no class names, no getattr/hasattr of an optimizer's
    fields (adding an optimizer must not touch them)."""
    fields = {f.name for cls in optim.OPTIMIZERS for f in dataclasses.fields(cls)}
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            assert node.id not in {c.__name__ for c in optim.OPTIMIZERS}, (path, node.lineno)
        if isinstance(node, ast.alias):
            assert node.name not in {c.__name__ for c in optim.OPTIMIZERS}, (path, node.name)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            assert not (isinstance(name, ast.Constant) and name.value in fields), (path, node.lineno)


# ---- the layout against native/optim.cuh (NVRTC, no GPU) ----------------------------------------------------------
def _layout_source(struct: type, kinds: dict[str, int], order: list[str] | None = None) -> str:
    """CUDA source whose static_asserts hold exactly when OptimParams has `struct`'s size and its fields in `order`
    (default `struct`'s) with `struct`'s C types, and each OPTIM_ kind its value in `kinds`. NVRTC has no offsetof: a
    constexpr aggregate filled positionally with 1, 2, ... shows each name's position, and fields of 4-byte types in
    the same order sit at the same offsets in C and in ctypes."""
    import ctypes

    c_names = {ctypes.c_int32: "int", ctypes.c_float: "float"}
    types = dict(struct._fields_)
    names = order or [name for name, _ in struct._fields_]
    assert all(ctypes.sizeof(t) == 4 for t in types.values())  # else positions would not imply offsets
    values = ", ".join(f"({c_names[types[name]]}){i + 1}" for i, name in enumerate(names))
    lines = [
        '#include "optim.cuh"',
        "template <class A, class B> struct same { static constexpr bool value = false; };",
        "template <class A> struct same<A, A> { static constexpr bool value = true; };",
        f'static_assert(sizeof(OptimParams) == {ctypes.sizeof(struct)}, "size");',
        f"constexpr OptimParams probe{{{values}}};",
    ]
    for name, ctype in struct._fields_:
        lines.append(f'static_assert(probe.{name} == {names.index(name) + 1}, "{name} position");')
        lines.append(f'static_assert(same<decltype(OptimParams::{name}), {c_names[ctype]}>::value, "{name} type");')
    lines += [f'static_assert({name} == {value}, "{name}");' for name, value in kinds.items()]
    lines.append('extern "C" __global__ void layout_probe(OptimParams p, float* out) { out[0] = p.eps; }')
    return "\n".join(lines) + "\n"


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ctypes_struct_matches_optim_cuh(arch):
    from fastnn.cuda import nvrtc  # the NVRTC wheel; no GPU needed
    from fastnn.cuda._loader import NvrtcError
    from fastnn.cuda.driver import arg_struct

    struct = type(arg_struct(EXAMPLES[optim.AdamW].kernel_params().c_fields()))
    kinds = {"OPTIM_" + k.removeprefix("KIND_"): v for k, v in vars(optim).items() if k.startswith("KIND_")}
    native = nvrtc.native_dir()
    nvrtc.compile_source(_layout_source(struct, kinds), "layout.cu", arch, include_dirs=[native])
    # The probe can fail: two fields swapped, or a kind renumbered, is a compile error.
    order = [name for name, _ in struct._fields_]
    i, j = order.index("beta2"), order.index("eps")
    order[i], order[j] = order[j], order[i]
    with pytest.raises(NvrtcError, match="eps position"):
        nvrtc.compile_source(_layout_source(struct, kinds, order), "layout.cu", arch, include_dirs=[native])
    with pytest.raises(NvrtcError, match="OPTIM_ADAMW"):
        nvrtc.compile_source(_layout_source(struct, dict(kinds, OPTIM_ADAMW=7)), "layout.cu", arch,
                             include_dirs=[native])  # fmt: skip


@pytest.mark.bindings
def test_arg_struct_checks_each_value_as_its_type():
    from fastnn.cuda import driver  # cuda-bindings; no GPU needed

    s = driver.arg_struct([("kind", "i32", 1), ("eps", "f32", 1e-8), ("n", "u64", 2**64 - 1)])
    assert (s.kind, s.n) == (1, 2**64 - 1) and s.eps == np.float32(1e-8)
    assert type(s) is type(driver.arg_struct([("kind", "i32", 0), ("eps", "f32", 0.0), ("n", "u64", 0)]))
    with pytest.raises(ConfigError, match="overflows float32"):
        driver.arg_struct([("lr", "f32", 1e39)])
    with pytest.raises(ConfigError, match="int32 argument = 2147483648"):
        driver.arg_struct([("kind", "i32", 2**31)])
    with pytest.raises(ConfigError, match="'x' has type 'f64'"):
        driver.arg_struct([("x", "f64", 1.0)])
