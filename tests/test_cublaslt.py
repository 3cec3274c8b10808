"""cuBLASLt bindings: CPU checks against the installed library and its headers; GPU checks against NumPy float64."""

from __future__ import annotations

import ctypes
import pickle
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from fastnn._errors import ConfigError, DeviceUnavailable, FastnnError
from fastnn.cuda import cublaslt as lt
from fastnn.cuda._loader import CudaLibraryError, checked_argtype, library_path

E = lt.Epilogue

# ---------------------------------------------------------------------------------------------------------------
# CPU: the library, its headers and the pure helpers
# ---------------------------------------------------------------------------------------------------------------


def _header_dir() -> Path:
    # pathfinder finds .../nvidia/<pkg>/lib/libcublasLt.so.N; the wheel ships the headers in ../include.
    include = Path(library_path("cublasLt")).parent.parent / "include"
    if not (include / "cublasLt.h").is_file():
        pytest.skip(f"the installed cuBLAS wheel ships no headers next to its library ({include})")
    return include


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _parse_enums(*texts: str) -> dict[str, int]:
    """Every `NAME = value` of every `typedef enum {...}` in the headers, expressions like (A | 128) evaluated."""
    values: dict[str, int] = {}
    for text in texts:
        for body in re.findall(r"typedef\s+enum\s*\w*\s*\{(.*?)\}", _strip_comments(text), flags=re.S):
            previous = -1
            for entry in body.split(","):
                entry = entry.strip()
                if not entry:
                    continue
                name, _, expr = entry.partition("=")
                name = name.split()[0]
                if expr.strip():
                    names = re.findall(r"(?<!\w)[A-Za-z_]\w*", expr)
                    if any(n not in values for n in names):
                        previous = None  # refers to something outside these headers: not needed here
                        continue
                    expr = re.sub(r"(?<!\w)[A-Za-z_]\w*", lambda mm: str(values[mm.group(0)]), expr)
                    expr = re.sub(r"(?<=[0-9a-fA-F])[uUlL]+\b", "", expr)  # 0x01ull -> 0x01
                    assert re.fullmatch(r"[\s\dxa-fA-F|&()+\-<>~]*", expr), expr
                    previous = int(eval(expr))  # only numbers and operators remain after the substitution
                elif previous is None:
                    continue
                else:
                    previous += 1
                values[name] = previous
    return values


@pytest.fixture(scope="module")
def header_enums() -> dict[str, int]:
    include = _header_dir()
    return _parse_enums((include / "cublas_api.h").read_text(), (include / "cublasLt.h").read_text())


@pytest.mark.bindings
@pytest.mark.parametrize(
    "enum, prefix",
    [
        (lt.Status, "CUBLAS_STATUS_"),
        (lt.ComputeType, "CUBLAS_"),
        (lt.Operation, "CUBLAS_OP_"),
        (lt.Epilogue, "CUBLASLT_EPILOGUE_"),
        (lt.MatmulDescAttribute, "CUBLASLT_MATMUL_DESC_"),
        (lt.MatrixLayoutAttribute, "CUBLASLT_MATRIX_LAYOUT_"),
        (lt.MatmulPreferenceAttribute, "CUBLASLT_MATMUL_PREF_"),
        (lt.PointerMode, "CUBLASLT_POINTER_MODE_"),
        (lt.Order, "CUBLASLT_ORDER_"),
    ],
)
def test_enum_values_match_the_header(header_enums, enum, prefix):
    for member in enum:
        c_name = prefix + member.name
        assert c_name in header_enums, f"{c_name} not found in the header"
        assert member.value == header_enums[c_name], f"{enum.__name__}.{member.name}"


@pytest.mark.bindings
def test_header_parser_reads_composite_epilogues(header_enums):
    # guards the parser itself: these values are spelled as expressions in cublasLt.h
    assert header_enums["CUBLASLT_EPILOGUE_RELU_AUX_BIAS"] == 134
    assert header_enums["CUBLASLT_EPILOGUE_DGELU_BGRAD"] == 208
    assert header_enums["CUBLAS_STATUS_NOT_SUPPORTED"] == 15


@pytest.mark.bindings
def test_data_type_values_match_cuda_bindings():
    # cudaDataType_t lives in library_types.h (CUDA toolkit), which the wheels do not ship; cuda-bindings has it.
    from cuda.bindings import runtime

    for member in lt.DataType:
        assert member.value == int(getattr(runtime.cudaDataType, f"CUDA_{member.name}")), member.name


@pytest.mark.bindings
def test_every_symbol_of_the_signature_table_resolves():
    lib = lt._lib()
    for name, (restype, argtypes) in lt._SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.argtypes == [checked_argtype(t) for t in argtypes], name  # integers range-checked
        if restype is lt._STATUS:
            assert fn.restype is ctypes.c_int and fn.errcheck is lt._errcheck, name
        else:
            assert fn.restype is restype, name


@pytest.mark.bindings
def test_libraries_load_lazily_not_at_import():
    code = (
        "import sys, fastnn, fastnn.cuda.cublaslt as lt, fastnn.cuda.cudnn as dnn\n"
        "assert lt._lib.cache_info().currsize == 0 and dnn._lib.cache_info().currsize == 0\n"
        "lt.version(); dnn.version()\n"
        "assert lt._lib.cache_info().currsize == 1 and dnn._lib.cache_info().currsize == 1\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


@pytest.mark.bindings
def test_version_is_plausible():
    v = lt.version()
    assert 120000 <= v < 1000000, v
    assert lt._lib().cublasLtGetCudartVersion() >= 12000


def test_heuristic_result_struct_matches_the_header_layout():
    # algo (8 x uint64) + size_t workspaceSize + status + float wavesCount + int reserved[4]
    assert ctypes.sizeof(lt._Algo) == 64
    assert ctypes.sizeof(lt._HeuristicResult) == 64 + 8 + 4 + 4 + 16


def test_status_names():
    assert lt.status_name(15) == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert lt.status_name(1) == "CUBLAS_STATUS_NOT_INITIALIZED"
    assert lt.status_name(999) == "CUBLAS_STATUS_UNKNOWN_999"


@pytest.mark.bindings
def test_failing_call_raises_cublas_error_with_status_name_and_what():
    desc = lt._MatmulDesc(lt.ComputeType.COMPUTE_32F, lt.DataType.R_32F)
    try:
        wrong_size = ctypes.c_uint8(1)  # EPILOGUE is a uint32_t: the library checks sizeInBytes
        with pytest.raises(lt.CublasError) as info:
            lt._lib().cublasLtMatmulDescSetAttribute(
                desc.ptr, int(lt.MatmulDescAttribute.EPILOGUE), ctypes.byref(wrong_size), 1
            )
    finally:
        desc.close()
    err = info.value
    assert isinstance(err, CudaLibraryError) and isinstance(err, FastnnError)
    assert err.status == 7 and err.status_name == "CUBLAS_STATUS_INVALID_VALUE"
    assert "cublasLtMatmulDescSetAttribute" in err.what
    assert str(err) == f"{err.what} failed: CUBLAS_STATUS_INVALID_VALUE (7)"


def test_errcheck_maps_not_supported_and_names_the_activity():
    def cublasLtMatmulAlgoGetHeuristic():  # stands in for the ctypes function object (only __name__ is read)
        pass

    with pytest.raises(lt.CublasError) as info, lt._doing("finding an algorithm for Matmul m=3"):
        lt._errcheck(15, cublasLtMatmulAlgoGetHeuristic, ())
    assert info.value.status_name == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert info.value.what == "cublasLtMatmulAlgoGetHeuristic (finding an algorithm for Matmul m=3)"
    assert lt._errcheck(0, cublasLtMatmulAlgoGetHeuristic, ()) == 0
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is lt.CublasError and str(copy) == str(info.value)


def _attr_value(attr):
    if attr in (lt.MatmulDescAttribute.BIAS_POINTER, lt.MatmulDescAttribute.EPILOGUE_AUX_POINTER):
        return 4096
    return {
        lt.MatmulDescAttribute.COMPUTE_TYPE: int(lt.ComputeType.COMPUTE_32F),
        lt.MatmulDescAttribute.TRANSA: 1,
        lt.MatmulDescAttribute.TRANSB: 1,
        lt.MatmulDescAttribute.FILL_MODE: 2,  # CUBLAS_FILL_MODE_FULL
        lt.MatmulDescAttribute.EPILOGUE: int(E.GELU_AUX_BIAS),
        lt.MatmulDescAttribute.EPILOGUE_AUX_LD: 256,
        lt.MatmulDescAttribute.BIAS_BATCH_STRIDE: 64,
        lt.MatmulDescAttribute.EPILOGUE_AUX_BATCH_STRIDE: 1024,
        lt.MatmulDescAttribute.SM_COUNT_TARGET: 7,
    }.get(attr, 0)


@pytest.mark.bindings
@pytest.mark.parametrize("attr", list(lt.MatmulDescAttribute))
def test_desc_attribute_types_have_the_library_sizes(attr):
    # Set and read back through the typed table: a size that differs from the library's raises INVALID_VALUE.
    with lt._MatmulDesc(lt.ComputeType.COMPUTE_32F, lt.DataType.R_32F) as desc:
        desc.set(attr, _attr_value(attr))
        assert desc.get(attr) == _attr_value(attr)


@pytest.mark.bindings
@pytest.mark.parametrize("attr", list(lt.MatrixLayoutAttribute))
def test_layout_attribute_types_have_the_library_sizes(attr):
    value = {lt.MatrixLayoutAttribute.ROWS: 5, lt.MatrixLayoutAttribute.COLS: 7, lt.MatrixLayoutAttribute.LD: 9}
    value |= {lt.MatrixLayoutAttribute.BATCH_COUNT: 1, lt.MatrixLayoutAttribute.TYPE: int(lt.DataType.R_16F)}
    with lt._Layout(lt.DataType.R_32F, 3, 4, 3) as layout:
        layout.set(attr, value.get(attr, 0))
        assert layout.get(attr) == value.get(attr, 0)


@pytest.mark.bindings
@pytest.mark.parametrize("attr", list(lt.MatmulPreferenceAttribute))
def test_preference_attribute_types_have_the_library_sizes(attr):
    with lt._Preference() as pref:
        pref.set(attr, 256 if "ALIGNMENT" in attr.name else 0)
        wrong = ctypes.c_uint16(0)
        with pytest.raises(lt.CublasError, match="INVALID_VALUE"):
            lt._lib().cublasLtMatmulPreferenceSetAttribute(pref.ptr, int(attr), ctypes.byref(wrong), 2)


def test_default_aux_ld():
    for ep in (E.RELU_AUX, E.RELU_AUX_BIAS, E.DRELU, E.DRELU_BGRAD):
        assert [lt.default_aux_ld(ep, m) for m in (1, 10, 128, 129, 300)] == [128, 128, 128, 256, 384]
    for ep in (E.GELU_AUX, E.GELU_AUX_BIAS, E.DGELU, E.DGELU_BGRAD):
        assert [lt.default_aux_ld(ep, m) for m in (1, 8, 9, 37, 64)] == [8, 8, 16, 40, 64]
    for ep in (E.DEFAULT, E.RELU, E.BIAS, E.RELU_BIAS, E.GELU, E.GELU_BIAS, E.BGRADA, E.BGRADB):
        assert lt.default_aux_ld(ep, 37) is None
    assert {ep for ep in E if lt.epilogue_uses_aux(ep)} == {ep for ep in E if lt.default_aux_ld(ep, 1) is not None}


def test_aux_nbytes_and_bias_length():
    assert lt.aux_nbytes(E.RELU_AUX_BIAS, 37, 10, lt.DataType.R_16F) == 128 // 8 * 10  # bits
    assert lt.aux_nbytes(E.DRELU, 200, 3, lt.DataType.R_32F) == 256 // 8 * 3
    assert lt.aux_nbytes(E.GELU_AUX_BIAS, 37, 10, lt.DataType.R_16F) == 40 * 10 * 2
    assert lt.aux_nbytes(E.DGELU, 37, 10, lt.DataType.R_32F, aux_ld=48) == 48 * 10 * 4
    assert lt.aux_nbytes(E.BIAS, 37, 10, lt.DataType.R_32F) == 0
    assert lt.bias_length(E.BGRADB, 37, 10) == 10
    assert all(lt.bias_length(ep, 37, 10) == 37 for ep in E if ep != E.BGRADB)
    assert {ep for ep in E if lt.epilogue_writes_bias(ep)} == {E.DRELU_BGRAD, E.DGELU_BGRAD, E.BGRADA, E.BGRADB}
    assert {ep for ep in E if lt.epilogue_reads_aux(ep)} == {E.DRELU, E.DRELU_BGRAD, E.DGELU, E.DGELU_BGRAD}


@pytest.mark.parametrize(
    "epilogue, aux_ld",
    [(E.RELU_AUX, 100), (E.RELU_AUX, 130), (E.DRELU, 0), (E.GELU_AUX, 36), (E.DGELU, 44), (E.BIAS, 128)],
)
def test_bad_aux_ld_is_a_config_error(epilogue, aux_ld):
    with pytest.raises(ConfigError, match="aux_ld"):
        lt.aux_nbytes(epilogue, 37, 4, lt.DataType.R_32F, aux_ld=aux_ld)


def test_scale_type():
    assert lt.scale_type(lt.ComputeType.COMPUTE_16F) == lt.DataType.R_16F
    assert lt.scale_type(lt.ComputeType.COMPUTE_32F) == lt.DataType.R_32F
    assert lt.scale_type(lt.ComputeType.COMPUTE_32F_FAST_TF32) == lt.DataType.R_32F
    assert lt.scale_type(lt.ComputeType.COMPUTE_64F) == lt.DataType.R_64F
    with pytest.raises(ConfigError, match="COMPUTE_32I"):
        lt.scale_type(lt.ComputeType.COMPUTE_32I)


@pytest.mark.bindings
@pytest.mark.parametrize("epilogue", list(E))
@pytest.mark.parametrize("transa, transb", [(False, False), (True, False), (False, True), (True, True)])
def test_descriptors_describe_the_product(epilogue, transa, transb):
    m, n, k = 37, 129, 61
    aux_ld = lt.default_aux_ld(epilogue, m)
    lda, ldb = (k if transa else m), (n if transb else k)
    d = lt._Descriptors(
        m, n, k, transa, transb, lt.DataType.R_16F, lt.DataType.R_32F, lt.ComputeType.COMPUTE_32F,
        lda, ldb, m, epilogue, aux_ld, True, 256,
    )  # fmt: skip
    try:
        A = lt.MatmulDescAttribute
        assert d.desc.get(A.COMPUTE_TYPE) == lt.ComputeType.COMPUTE_32F
        assert d.desc.get(A.SCALE_TYPE) == lt.DataType.R_32F
        assert d.desc.get(A.EPILOGUE) == epilogue
        assert d.desc.get(A.TRANSA) == int(transa) and d.desc.get(A.TRANSB) == int(transb)
        assert d.desc.get(A.POINTER_MODE) == lt.PointerMode.DEVICE
        assert d.desc.get(A.EPILOGUE_AUX_LD) == (aux_ld or 0)
        assert d.desc.get(A.EPILOGUE_AUX_POINTER) == (256 if aux_ld else 0)
        assert d.desc.get(A.BIAS_POINTER) == (256 if lt.epilogue_uses_bias(epilogue) else 0)
        L = lt.MatrixLayoutAttribute
        shape = lambda layout: (layout.get(L.ROWS), layout.get(L.COLS), layout.get(L.LD), layout.get(L.TYPE))  # noqa: E731
        assert shape(d.a) == ((k, m) if transa else (m, k)) + (lda, lt.DataType.R_16F)
        assert shape(d.b) == ((n, k) if transb else (k, n)) + (ldb, lt.DataType.R_16F)
        assert shape(d.cd) == (m, n, m, lt.DataType.R_32F)
        assert d.cd.get(L.ORDER) == lt.Order.COL
    finally:
        d.close()
    assert d.desc.closed and d.a.closed and d.cd.closed


@pytest.mark.bindings
@pytest.mark.parametrize("target", [0, 100])
def test_descriptors_carry_the_sm_count_target(target):
    # 0 leaves the library's default (every SM); a data-parallel engine passes fewer to leave SMs to NCCL.
    d = lt._Descriptors(
        64, 64, 64, False, False, lt.DataType.R_16F, lt.DataType.R_16F, lt.ComputeType.COMPUTE_32F,
        64, 64, 64, E.DEFAULT, None, False, 256, sm_count_target=target,
    )  # fmt: skip
    try:
        assert d.desc.get(lt.MatmulDescAttribute.SM_COUNT_TARGET) == target
    finally:
        d.close()


def _matmul_kwargs(**over):
    kw = dict(
        transa=False, transb=False, ab_type=lt.DataType.R_32F, cd_type=lt.DataType.R_32F,
        compute=lt.ComputeType.COMPUTE_32F, workspace=None,
    )  # fmt: skip
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "args, over, named",
    [
        ((0, 4, 4), {}, "m must be"),
        ((4, -1, 4), {}, "n must be"),
        ((4, 4, 2.5), {}, "k must be"),
        ((4, 4, 4), {"lda": 3}, "lda must be"),
        ((4, 4, 8), {"transa": True, "lda": 4}, "lda must be"),
        ((4, 4, 8), {"ldb": 4}, "ldb must be"),
        ((4, 4, 4), {"ldc": 2}, "ldc must be"),
        ((4, 4, 4), {"epilogue": E.RELU_AUX, "aux_ld": 64}, "aux_ld"),
        ((4, 4, 4), {"epilogue": 3}, "Matmul"),
        ((4, 4, 4), {"min_alignment": 48}, "min_alignment"),
        ((4, 4, 4), {"max_algos": 0}, "max_algos"),
        ((4, 4, 4), {"sm_count_target": -1}, "sm_count_target"),
        ((4, 4, 4), {"sm_count_target": True}, "sm_count_target"),
        ((4, 4, 4), {}, "workspace must be"),
    ],
)
def test_matmul_rejects_bad_arguments_before_any_gpu_work(args, over, named):
    with pytest.raises(ConfigError, match=named):
        lt.Matmul(None, *args, **_matmul_kwargs(**over))


@pytest.mark.bindings
def test_handle_without_gpu_is_device_unavailable():
    from fastnn._device import cuda_status

    if cuda_status()[0]:
        pytest.skip("a GPU is usable here: cublasLtCreate succeeds")
    with pytest.raises(DeviceUnavailable, match="CUBLAS_STATUS_NOT_INITIALIZED.*no usable CUDA driver or GPU"):
        lt.Handle()


def _cpu_workspace(nbytes: int = 1 << 20) -> lt.Workspace:
    ws = object.__new__(lt.Workspace)  # no device memory: the plan only passes its address and size on
    ws.nbytes, ws.ptr = nbytes, 1 << 30
    return ws


@pytest.fixture
def cpu_plan(monkeypatch):
    """A Matmul (RELU_AUX_BIAS) built without a GPU: its real descriptors (host-only) and a blank algorithm in place
    of the heuristic's; `calls` records every cublasLtMatmul call, which returns success (libc's labs of the NULL
    handle, through the declaration the plan uses)."""
    monkeypatch.setattr(lt.Matmul, "_heuristic", lambda self: [lt._Algo()])
    plan = lt.Matmul(
        type("FakeHandle", (), {"ptr": 0})(), 64, 32, 64, transa=True, transb=False, ab_type=lt.DataType.R_16F,
        cd_type=lt.DataType.R_16F, compute=lt.ComputeType.COMPUTE_32F, epilogue=E.RELU_AUX_BIAS,
        workspace=_cpu_workspace(),
    )  # fmt: skip
    labs = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(ctypes.CDLL(None).labs, ctypes.c_void_p).value)
    restype, argtypes = lt._SIGNATURES["cublasLtMatmul"]
    labs.argtypes, labs.errcheck = argtypes, lt._errcheck
    plan.calls = []

    def cublas_lt_matmul(*args):
        plan.calls.append(args)
        return labs(*args)

    monkeypatch.setattr(lt, "_matmul_call", lambda: cublas_lt_matmul)
    yield plan
    plan.close()


@pytest.mark.bindings
@pytest.mark.parametrize(
    "bad, named",
    [
        ({"a": 0}, "a must be a device pointer"),
        ({"b": -256}, "b must be a device pointer"),
        ({"d": 256.0}, "d must be a device pointer"),
        ({"a": True}, "a must be a device pointer"),
        ({"b": 4096 + 16}, "b=0x1010 is not 256-byte aligned"),
        ({"c": 4096 + 4}, "c=0x1004 is not 256-byte aligned"),
        ({"bias": 0}, r"bias \(needed by RELU_AUX_BIAS\) must be a device pointer"),
        ({"aux": 4100}, r"aux \(needed by RELU_AUX_BIAS\)=0x1004 is not 256-byte aligned"),
        ({"alpha": "1"}, "alpha and beta must be numbers"),
        ({"beta": None}, "alpha and beta must be numbers"),
        ({"d": 2**64 + 8192}, "d must be a device pointer"),  # c_void_p would wrap it to 8192
    ],
)
def test_matmul_call_refuses_bad_arguments_before_the_library_call(cpu_plan, bad, named):
    args = {"a": 4096, "b": 4096, "c": 0, "d": 8192, "bias": 4096, "aux": 4096, "alpha": 1.0, "beta": 0.0}
    args.update(bad)
    with pytest.raises(ConfigError, match=named):
        cpu_plan(args.pop("a"), args.pop("b"), args.pop("c"), args.pop("d"), None, **args)
    assert cpu_plan.calls == []


@pytest.mark.bindings
def test_matmul_call_passes_checked_values_and_keeps_the_descriptor_pointers(cpu_plan):
    A = lt.MatmulDescAttribute
    cpu_plan(np.int64(4096), 8192, 0, 12288, 77, bias=np.uint64(512), aux=1024, alpha=np.float32(0.5), beta=2)
    (args,) = cpu_plan.calls
    handle, desc, alpha, a, adesc, b, bdesc, beta, c, cdesc, d, ddesc, algo, ws, ws_bytes, stream = args
    assert (a, b, c, d, stream) == (4096, 8192, 12288, 12288, 77)  # c = 0: C is D
    assert all(type(v) is int for v in (a, b, c, d))  # numpy integers become ints
    assert (desc, adesc, bdesc, cdesc, ddesc) == (cpu_plan._d.desc.ptr, cpu_plan._d.a.ptr, cpu_plan._d.b.ptr,
                                                  cpu_plan._d.cd.ptr, cpu_plan._d.cd.ptr)  # fmt: skip
    assert (ws, ws_bytes) == (1 << 30, 1 << 20)
    assert alpha == cpu_plan._alpha.ctypes.data and beta == cpu_plan._beta.ctypes.data
    assert cpu_plan._alpha[0] == 0.5 and cpu_plan._beta[0] == 2.0  # packed in the scale type, read at the call
    assert cpu_plan._d.desc.get(A.BIAS_POINTER) == 512 and cpu_plan._d.desc.get(A.EPILOGUE_AUX_POINTER) == 1024
    cpu_plan(4096, 8192, 0, 12288, None, bias=768, aux=1024, alpha=1.0)
    assert cpu_plan._d.desc.get(A.BIAS_POINTER) == 768 and cpu_plan.calls[-1][-1] == 0  # None: the legacy stream
    assert cpu_plan._alpha[0] == 1.0 and cpu_plan._beta[0] == 0.0


@pytest.mark.bindings
def test_matmul_call_failure_and_closed_plan_name_the_plan(cpu_plan, monkeypatch):
    def failing(*args):
        def cublasLtMatmul():  # stands in for the ctypes function object (only __name__ is read)
            pass

        lt._errcheck(int(lt.Status.EXECUTION_FAILED), cublasLtMatmul, args)

    monkeypatch.setattr(lt, "_matmul_call", lambda: failing)
    with pytest.raises(lt.CublasError) as info:
        cpu_plan(4096, 4096, 0, 4096, None, bias=4096, aux=4096)
    assert info.value.status_name == "CUBLAS_STATUS_EXECUTION_FAILED"
    assert info.value.what == f"cublasLtMatmul ({cpu_plan.describe()})"
    cpu_plan.close()
    with pytest.raises(ConfigError, match="Matmul m=64 n=32 k=64 .* is closed"):
        cpu_plan(4096, 4096, 0, 4096, None, bias=4096, aux=4096)


@pytest.mark.bindings
def test_matmul_call_declaration_checks_its_one_integer_at_plan_build(monkeypatch):
    """The hot path's cublasLtMatmul skips the per-call range check of checked_argtype: the table's own types, the
    same errcheck; its only integer argument, the workspace size, is refused when the plan is built instead."""
    fn = lt._matmul_call()
    restype, argtypes = lt._SIGNATURES["cublasLtMatmul"]
    assert fn.argtypes == argtypes and fn.restype is ctypes.c_int and fn.errcheck is lt._errcheck
    checked = lt._lib().cublasLtMatmul  # every other caller's: unchanged
    assert fn is not checked and checked.argtypes == [checked_argtype(t) for t in argtypes]
    monkeypatch.setattr(lt.Matmul, "_heuristic", lambda self: [lt._Algo()])
    with pytest.raises(ConfigError, match="workspace nbytes = 18446744073709551616 does not fit C type c_ulong"):
        lt.Matmul(None, 8, 8, 8, **_matmul_kwargs(workspace=_cpu_workspace(2**64)))


# ---------------------------------------------------------------------------------------------------------------
# GPU: every epilogue, transpose and precision against NumPy float64
# ---------------------------------------------------------------------------------------------------------------

# name: (A/B type, C/D type, compute, numpy A/B, numpy C/D, tolerance on max|err| / max|expected|)
PRECISIONS = {
    "fp32": (lt.DataType.R_32F, lt.DataType.R_32F, lt.ComputeType.COMPUTE_32F, np.float32, np.float32, 1e-5),
    "fp16-in-fp32-out": (
        lt.DataType.R_16F,
        lt.DataType.R_32F,
        lt.ComputeType.COMPUTE_32F,
        np.float16,
        np.float32,
        1e-3,
    ),
    "fp16-compute32": (lt.DataType.R_16F, lt.DataType.R_16F, lt.ComputeType.COMPUTE_32F, np.float16, np.float16, 2e-3),
    "fp16-compute16": (lt.DataType.R_16F, lt.DataType.R_16F, lt.ComputeType.COMPUTE_16F, np.float16, np.float16, 2e-2),
}
SHAPES = [(37, 129, 61), (10, 128, 784), (10, 1, 784)]  # odd sizes; an MNIST layer; batch 1 (n = batch)
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]

# Combinations cuBLASLt is documented not to support: {(epilogue, condition): reason}. Add an entry only with a
# reference to the cuBLAS documentation; any other NOT_SUPPORTED fails the test, naming the combination.
DOCUMENTED_UNSUPPORTED: dict = {
    # NVIDIA's nvmath-python skips this case in tests/nvmath_tests/linalg/advanced/matmul/test_epilog.py
    # ("BGRADB doesn't support m=1", its m being the columns of D, our n).
    (E.BGRADB, lambda m, n, k, transa, transb, precision: n == 1): "BGRADB with a single column of D (n=1)",
}

# Combinations cuBLASLt 13.1 on an H200 answered NOT_SUPPORTED for, in every precision and shape tried (a device
# run of this file, 2026-11-22): the bias-gradient epilogues reduce op(A) only when A is not transposed, and op(B)
# only when B is transposed. The engine uses BGRADB with transb=True only. For these the test checks that the
# binding refuses cleanly (CublasError, CUBLAS_STATUS_NOT_SUPPORTED, the epilogue named), then skips the numbers.
OBSERVED_UNSUPPORTED: dict = {
    (E.BGRADA, lambda m, n, k, transa, transb, precision: transa): "BGRADA with transa=True",
    (E.BGRADB, lambda m, n, k, transa, transb, precision: not transb): "BGRADB with transb=False",
}

_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def dgelu(x):
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x**2)


def pack_relu_mask(mask: np.ndarray, aux_ld: int) -> np.ndarray:
    """ReLU bit-mask as cuBLASLt lays it out: column-major, bit i%8 of byte i//8 of column j, ld in bits."""
    m, n = mask.shape
    bits = np.zeros((n, aux_ld), dtype=bool)
    bits[:, :m] = mask.T
    return np.packbits(bits, axis=1, bitorder="little")


def unpack_relu_mask(raw: np.ndarray, m: int, n: int, aux_ld: int) -> np.ndarray:
    return np.unpackbits(raw.reshape(n, aux_ld // 8), axis=1, bitorder="little")[:, :m].T.astype(bool)


def rel_err(got: np.ndarray, expected: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return np.inf  # NaN poison survived: an element was not written
    return float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30))


class Gpu:
    """Device-side helpers for the tests: buffers are freed at the end of each test."""

    def __init__(self):
        from fastnn.cuda import driver

        self.driver = driver
        self.device = driver.get_device(0)
        self.stream = driver.Stream(self.device)
        self.handle = lt.Handle(self.device)
        self.workspace = lt.Workspace(device=self.device)
        self.buffers = []

    def buffer(self, nbytes: int, poison: int | None = 0xFF):
        buf = self.driver.DeviceBuffer(nbytes, self.device)
        self.buffers.append(buf)
        if poison is not None:
            buf.memset(poison)  # 0xFF bytes are NaN in fp16 and fp32
        return buf

    def upload_matrix(self, mat: np.ndarray, ld: int | None = None):
        """A column-major copy of the 2-D `mat` (rows x cols, leading dimension ld >= rows)."""
        rows, cols = mat.shape
        ld = ld or rows
        stored = np.zeros((cols, ld), dtype=mat.dtype)
        stored[:, :rows] = mat.T
        buf = self.buffer(stored.nbytes, poison=None)
        buf.upload(stored)
        return buf

    def upload(self, arr: np.ndarray):
        buf = self.buffer(arr.nbytes, poison=None)
        buf.upload(np.ascontiguousarray(arr))
        return buf

    def download_matrix(self, buf, rows: int, cols: int, dtype, ld: int | None = None) -> np.ndarray:
        ld = ld or rows
        stored = buf.download(np.empty((cols, ld), dtype=dtype))
        return stored[:, :rows].T.astype(np.float64)

    def free(self):
        for buf in self.buffers:
            buf.close()
        self.buffers.clear()


@pytest.fixture(scope="module")
def gpu():
    g = Gpu()
    yield g
    g.free()
    g.workspace.close()
    g.handle.close()
    g.stream.close()


@pytest.fixture
def g(gpu):
    yield gpu
    gpu.free()


def build(g, m, n, k, *, epilogue=E.DEFAULT, precision="fp32", transa=False, transb=False, **kw):
    ab, cd, compute = PRECISIONS[precision][:3]
    for (ep, applies), reason in OBSERVED_UNSUPPORTED.items():
        if ep == epilogue and applies(m=m, n=n, k=k, transa=transa, transb=transb, precision=precision):
            with pytest.raises(lt.CublasError) as info:
                lt.Matmul(
                    g.handle, m, n, k, transa=transa, transb=transb, ab_type=ab, cd_type=cd, compute=compute,
                    epilogue=epilogue, workspace=g.workspace, **kw,
                )  # fmt: skip
            assert info.value.status_name == "CUBLAS_STATUS_NOT_SUPPORTED" and epilogue.name in str(info.value)
            pytest.skip(f"verified that the binding refuses cleanly; cuBLASLt does not support {reason}")
    try:
        return lt.Matmul(
            g.handle, m, n, k, transa=transa, transb=transb, ab_type=ab, cd_type=cd, compute=compute,
            epilogue=epilogue, workspace=g.workspace, **kw,
        )  # fmt: skip
    except lt.CublasError as exc:
        if exc.status != lt.Status.NOT_SUPPORTED:
            raise
        for (ep, applies), reason in DOCUMENTED_UNSUPPORTED.items():
            if ep == epilogue and applies(m=m, n=n, k=k, transa=transa, transb=transb, precision=precision):
                pytest.skip(f"documented as unsupported by cuBLASLt: {reason}")
        pytest.fail(
            f"cuBLASLt found no algorithm for {epilogue.name} {precision} m={m} n={n} k={k} transa={transa} "
            f"transb={transb}: {exc}. If the cuBLAS documentation lists this combination as unsupported, add it "
            f"to DOCUMENTED_UNSUPPORTED with the reference; otherwise it is a bug in the plan."
        )


def operands(rng, m, n, k, transa, transb, np_ab):
    """Stored A and B (rounded to the A/B type) and op(A), op(B) in float64."""
    sa = rng.uniform(-1, 1, (k, m) if transa else (m, k)).astype(np_ab)
    sb = rng.uniform(-1, 1, (n, k) if transb else (k, n)).astype(np_ab)
    op_a = (sa.T if transa else sa).astype(np.float64)
    op_b = (sb.T if transb else sb).astype(np.float64)
    return sa, sb, op_a, op_b


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("transa, transb", TRANSPOSES, ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("epilogue", list(E), ids=lambda e: e.name)
def test_matmul_epilogue_against_numpy(g, epilogue, precision, transa, transb, shape):
    m, n, k = shape
    _, _, _, np_ab, np_cd, tol = PRECISIONS[precision]
    if epilogue in (E.GELU, E.GELU_AUX, E.GELU_BIAS, E.GELU_AUX_BIAS, E.DGELU, E.DGELU_BGRAD):
        tol = max(tol, 1e-3)  # cuBLASLt may evaluate tanh with the hardware approximation (rel. err ~2^-11)
    rng = np.random.default_rng(zlib.crc32(repr((epilogue.value, precision, transa, transb, shape)).encode()))
    sa, sb, op_a, op_b = operands(rng, m, n, k, transa, transb, np_ab)
    prod = op_a @ op_b
    plan = build(g, m, n, k, epilogue=epilogue, precision=precision, transa=transa, transb=transb)
    aux_ld = plan.aux_ld
    kwargs = {}
    expected_bias = expected_aux = None
    pre = prod

    if epilogue in lt._BIAS_INPUTS:
        bias = rng.uniform(-1, 1, m).astype(np_cd)  # bias has the D type
        kwargs["bias"] = g.upload(bias).ptr
        pre = prod + bias.astype(np.float64)[:, None]
    elif lt.epilogue_writes_bias(epilogue):
        out_bias = g.buffer(lt.bias_length(epilogue, m, n) * np.dtype(np_cd).itemsize)
        kwargs["bias"] = out_bias.ptr
    if epilogue in (E.DRELU, E.DRELU_BGRAD):
        mask = rng.random((m, n)) < 0.5
        kwargs["aux"] = g.upload(pack_relu_mask(mask, aux_ld)).ptr
        expected = prod * mask
    elif epilogue in (E.DGELU, E.DGELU_BGRAD):
        gelu_in = rng.normal(0, 1.5, (m, n)).astype(np_cd)  # the pre-activation a GELU_AUX forward stored
        kwargs["aux"] = g.upload_matrix(gelu_in, ld=aux_ld).ptr
        expected = prod * dgelu(gelu_in.astype(np.float64))
    elif epilogue in (E.RELU, E.RELU_AUX, E.RELU_BIAS, E.RELU_AUX_BIAS):
        expected = np.maximum(pre, 0)
    elif epilogue in (E.GELU, E.GELU_AUX, E.GELU_BIAS, E.GELU_AUX_BIAS):
        expected = gelu(pre)
    else:  # DEFAULT, BIAS, BGRADA, BGRADB
        expected = pre
    if epilogue in (E.DRELU_BGRAD, E.DGELU_BGRAD):
        expected_bias = expected.sum(axis=1)  # row sums of the gradient it produced
    elif epilogue == E.BGRADA:
        expected_bias = op_a.sum(axis=1)  # op(A) reduced over k: length m
    elif epilogue == E.BGRADB:
        expected_bias = op_b.sum(axis=0)  # op(B) reduced over k: length n
    if epilogue in (E.RELU_AUX, E.RELU_AUX_BIAS, E.GELU_AUX, E.GELU_AUX_BIAS):
        aux_out = g.buffer(lt.aux_nbytes(epilogue, m, n, PRECISIONS[precision][1]))
        kwargs["aux"] = aux_out.ptr
        expected_aux = pre

    a, b = g.upload_matrix(sa), g.upload_matrix(sb)
    d = g.buffer(m * n * np.dtype(np_cd).itemsize)
    with plan:
        plan(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, **kwargs)
        g.stream.synchronize()
    got = g.download_matrix(d, m, n, np_cd)
    assert rel_err(got, expected) <= tol, f"D: rel err {rel_err(got, expected):.2e} > {tol}"

    if expected_bias is not None:
        got_bias = out_bias.download(np.empty(expected_bias.size, np_cd))
        err = rel_err(got_bias, expected_bias)
        assert err <= 2 * tol, f"bias gradient: rel err {err:.2e} > {2 * tol}"
    if expected_aux is not None and epilogue in (E.GELU_AUX, E.GELU_AUX_BIAS):
        got_aux = g.download_matrix(aux_out, m, n, np_cd, ld=aux_ld)
        err = rel_err(got_aux, expected_aux)
        assert err <= tol, f"GELU aux (pre-activation): rel err {err:.2e} > {tol}"
    if expected_aux is not None and epilogue in (E.RELU_AUX, E.RELU_AUX_BIAS):
        raw = aux_out.download(np.empty(aux_ld // 8 * n, np.uint8))
        bits = unpack_relu_mask(raw, m, n, aux_ld)
        clear = np.abs(expected_aux) > 4 * tol * np.max(np.abs(expected_aux))  # skip values rounding could flip
        assert np.array_equal(bits[clear], expected_aux[clear] > 0), "ReLU bit-mask differs from pre-activation > 0"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_forward_aux_feeds_backward_epilogue(g, precision, activation):
    """RELU_AUX_BIAS / GELU_AUX_BIAS write aux; DRELU_BGRAD / DGELU_BGRAD consume it (one MLP layer's fwd/bwd)."""
    m, n, k_fwd, k_bwd = 37, 129, 61, 23
    _, cd, _, np_ab, np_cd, tol = PRECISIONS[precision]
    tol = max(tol, 1e-3) if activation == "gelu" else tol
    fwd_ep, bwd_ep = (E.RELU_AUX_BIAS, E.DRELU_BGRAD) if activation == "relu" else (E.GELU_AUX_BIAS, E.DGELU_BGRAD)
    rng = np.random.default_rng(7)
    sa, sb, op_a, op_b = operands(rng, m, n, k_fwd, False, False, np_ab)
    bias = rng.uniform(-1, 1, m).astype(np_cd)
    fwd = build(g, m, n, k_fwd, epilogue=fwd_ep, precision=precision)
    bwd = build(g, m, n, k_bwd, epilogue=bwd_ep, precision=precision, transa=True)
    assert fwd.aux_ld == bwd.aux_ld
    aux = g.buffer(lt.aux_nbytes(fwd_ep, m, n, cd))
    y = g.buffer(m * n * np.dtype(np_cd).itemsize)
    with fwd:
        fwd(
            g.upload_matrix(sa).ptr,
            g.upload_matrix(sb).ptr,
            y.ptr,
            y.ptr,
            g.stream,
            bias=g.upload(bias).ptr,
            aux=aux.ptr,
        )
    y_host = g.download_matrix(y, m, n, np_cd)
    pre = op_a @ op_b + bias.astype(np.float64)[:, None]

    sa2, sb2, op_a2, op_b2 = operands(rng, m, n, k_bwd, True, False, np_ab)
    dx = g.buffer(m * n * np.dtype(np_cd).itemsize)
    dbias = g.buffer(m * np.dtype(np_cd).itemsize)
    with bwd:
        bwd(g.upload_matrix(sa2).ptr, g.upload_matrix(sb2).ptr, dx.ptr, dx.ptr, g.stream, bias=dbias.ptr, aux=aux.ptr)
    got = g.download_matrix(dx, m, n, np_cd)
    if activation == "relu":
        factor = (y_host > 0).astype(np.float64)  # the GPU's own mask: relu(pre) > 0 exactly where the bit is set
    else:
        factor = dgelu(g.download_matrix(aux, m, n, np_cd, ld=fwd.aux_ld))
        assert rel_err(g.download_matrix(aux, m, n, np_cd, ld=fwd.aux_ld), pre) <= tol
    expected = (op_a2 @ op_b2) * factor
    assert rel_err(got, expected) <= tol
    assert rel_err(dbias.download(np.empty(m, np_cd)), expected.sum(axis=1)) <= 2 * tol


@pytest.mark.gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_beta_one_accumulates_in_place(g, precision):
    m, n, k = 37, 129, 61
    _, _, _, np_ab, np_cd, tol = PRECISIONS[precision]
    rng = np.random.default_rng(3)
    sa, sb, op_a, op_b = operands(rng, m, n, k, False, True, np_ab)
    c0 = rng.uniform(-1, 1, (m, n)).astype(np_cd)
    d = g.upload_matrix(c0)
    with build(g, m, n, k, precision=precision, transb=True) as plan:
        a, b = g.upload_matrix(sa), g.upload_matrix(sb)
        plan(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, alpha=1.0, beta=1.0)
        plan(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, alpha=0.5, beta=1.0)
    expected = c0.astype(np.float64) + 1.5 * (op_a @ op_b)
    assert rel_err(g.download_matrix(d, m, n, np_cd), expected) <= 2 * tol


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16-compute32", "fp16-compute16"])
def test_device_scalars(g, precision):
    m, n, k = 10, 128, 784
    _, _, compute, np_ab, np_cd, tol = PRECISIONS[precision]
    np_scale = np.float16 if lt.scale_type(compute) == lt.DataType.R_16F else np.float32
    rng = np.random.default_rng(4)
    sa, sb, op_a, op_b = operands(rng, m, n, k, True, False, np_ab)
    c = rng.uniform(-1, 1, (m, n)).astype(np_cd)
    alpha, beta = g.upload(np.array([2.0], np_scale)), g.upload(np.array([-0.5], np_scale))
    d = g.buffer(m * n * np.dtype(np_cd).itemsize)
    with build(g, m, n, k, precision=precision, transa=True, device_scalars=True) as plan:
        with pytest.raises(ConfigError, match="alpha"):
            plan(1024, 1024, 0, 1024, g.stream, alpha=2.0, beta=0.0)  # host numbers in device mode
        plan(g.upload_matrix(sa).ptr, g.upload_matrix(sb).ptr, g.upload_matrix(c).ptr, d.ptr, g.stream,
             alpha=alpha.ptr, beta=beta.ptr)  # fmt: skip
    expected = 2.0 * (op_a @ op_b) - 0.5 * c.astype(np.float64)
    assert rel_err(g.download_matrix(d, m, n, np_cd), expected) <= tol


@pytest.mark.gpu
def test_autotune_keeps_a_correct_fastest_algorithm(g):
    m, n, k = 10, 128, 784
    rng = np.random.default_rng(5)
    sa, sb, op_a, op_b = operands(rng, m, n, k, True, False, np.float16)
    a, b = g.upload_matrix(sa), g.upload_matrix(sb)
    d = g.buffer(m * n * 2)
    with build(g, m, n, k, precision="fp16-compute32", transa=True) as plan:
        assert 1 <= plan.algo_count <= 8
        ms = plan.autotune(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, repeats=5)
        assert 0 < ms < 1000 and 0 <= plan.algo_index < plan.algo_count
        d.memset(0xFF)
        plan(a.ptr, b.ptr, d.ptr, d.ptr, g.stream)
    assert rel_err(g.download_matrix(d, m, n, np.float16), op_a @ op_b) <= PRECISIONS["fp16-compute32"][5]


@pytest.mark.gpu
def test_autotune_choice_is_reused_from_disk_by_a_new_plan(g, tmp_path, monkeypatch):
    """The heuristic returns the same algorithm bytes to a second plan of the same shape (what the on-disk cache
    relies on), and that plan selects the cached choice without timing any candidate."""
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path / "cache"))
    m, n, k = 1024, 128, 784
    rng = np.random.default_rng(6)
    sa, sb, op_a, op_b = operands(rng, m, n, k, True, False, np.float16)
    a, b = g.upload_matrix(sa), g.upload_matrix(sb)
    d = g.buffer(m * n * 2)
    with build(g, m, n, k, precision="fp16-compute32", transa=True, max_algos=16) as first:
        ms = first.autotune(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, repeats=5)
        chosen, candidates = bytes(first._algo), [bytes(x) for x in first._algos]
    assert len(list((tmp_path / "cache").glob("*.cublaslt"))) == 1

    def not_again(*args, **kwargs):
        raise AssertionError("timed again despite the cached choice")

    monkeypatch.setattr(lt.Matmul, "_time_candidates", not_again)
    with build(g, m, n, k, precision="fp16-compute32", transa=True, max_algos=16) as second:
        assert [bytes(x) for x in second._algos] == candidates
        assert second.autotune(a.ptr, b.ptr, d.ptr, d.ptr, g.stream, repeats=5) == ms
        assert bytes(second._algo) == chosen
        d.memset(0xFF)
        second(a.ptr, b.ptr, d.ptr, d.ptr, g.stream)
    assert rel_err(g.download_matrix(d, m, n, np.float16), op_a @ op_b) <= PRECISIONS["fp16-compute32"][5]


@pytest.mark.gpu
def test_call_checks_pointers_and_close(g):
    plan = build(g, 8, 8, 8, epilogue=E.BIAS)
    buf = g.buffer(1024)
    with pytest.raises(ConfigError, match="bias"):
        plan(buf.ptr, buf.ptr, 0, buf.ptr, g.stream)  # BIAS needs a bias pointer
    with pytest.raises(ConfigError, match="256-byte aligned"):
        plan(buf.ptr + 4, buf.ptr, 0, buf.ptr, g.stream, bias=buf.ptr)
    plan.close()
    plan.close()  # idempotent
    with pytest.raises(ConfigError, match="closed"):
        plan(buf.ptr, buf.ptr, 0, buf.ptr, g.stream, bias=buf.ptr)


@pytest.mark.gpu
def test_unsupported_combination_names_the_plan(g):
    with pytest.raises(lt.CublasError, match="Matmul m=8 n=8 k=8"):
        lt.Matmul(
            g.handle, 8, 8, 8, transa=False, transb=False, ab_type=lt.DataType.R_64F, cd_type=lt.DataType.R_16F,
            compute=lt.ComputeType.COMPUTE_16F, workspace=g.workspace,
        )  # fmt: skip


@pytest.mark.gpu
def test_graph_of_plans_and_softmax_replayed_1000_times(g):
    """Two fused layers, a cuDNN softmax and an accumulating GEMM in one graph: every replay must run."""
    from fastnn.cuda import cudnn

    f32 = lt.DataType.R_32F
    batch, inp, hidden, classes = 64, 96, 48, 10
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (inp, batch)).astype(np.float32)  # column-major inputs: one column per sample
    w1 = rng.uniform(-0.3, 0.3, (hidden, inp)).astype(np.float32)
    b1 = rng.uniform(-0.3, 0.3, hidden).astype(np.float32)
    w2 = rng.uniform(-0.3, 0.3, (classes, hidden)).astype(np.float32)
    eye = np.eye(classes, dtype=np.float32)

    dx, dw1, db1, dw2, deye = (g.upload_matrix(v) if v.ndim == 2 else g.upload(v) for v in (x, w1, b1, w2, eye))
    h = g.buffer(hidden * batch * 4)
    logits = g.buffer(classes * batch * 4)
    probs = g.buffer(classes * batch * 4)
    acc = g.buffer(classes * batch * 4, poison=0)

    common = dict(transa=False, transb=False, ab_type=f32, cd_type=f32, compute=lt.ComputeType.COMPUTE_32F)
    layer1 = lt.Matmul(g.handle, hidden, batch, inp, epilogue=E.RELU_BIAS, workspace=g.workspace, **common)
    layer2 = lt.Matmul(g.handle, classes, batch, hidden, workspace=g.workspace, **common)
    accumulate = lt.Matmul(g.handle, classes, batch, classes, workspace=g.workspace, **common)
    handle = cudnn.Handle(g.stream, g.device)
    # column-major classes x batch is row-major (batch, classes): one softmax row per sample
    softmax = cudnn.Softmax(handle, batch, classes, "fp32")

    def step():
        layer1(dw1.ptr, dx.ptr, h.ptr, h.ptr, g.stream, bias=db1.ptr)
        layer2(dw2.ptr, h.ptr, logits.ptr, logits.ptr, g.stream)
        softmax.forward(logits.ptr, probs.ptr)
        accumulate(deye.ptr, probs.ptr, acc.ptr, acc.ptr, g.stream, beta=1.0)  # acc += probs

    try:
        step()  # eager run first: loads every kernel before capture
        eager = g.download_matrix(probs, classes, batch, np.float32)
        z = w2.astype(np.float64) @ np.maximum(w1.astype(np.float64) @ x + b1[:, None], 0)
        e = np.exp(z - z.max(axis=0))
        assert rel_err(eager, e / e.sum(axis=0)) <= 1e-5
        acc.memset(0)

        g.stream.begin_capture()
        step()
        graph = g.stream.end_capture()
        exe = graph.instantiate()
        assert g.download_matrix(acc, classes, batch, np.float32).max() == 0  # capture ran nothing
        for _ in range(1000):
            exe.launch(g.stream)
        g.stream.synchronize()
        assert rel_err(g.download_matrix(acc, classes, batch, np.float32), 1000 * eager) <= 1e-4
        assert rel_err(g.download_matrix(probs, classes, batch, np.float32), eager) <= 1e-6
        exe.close()
        graph.close()
    finally:
        for owned in (layer1, layer2, accumulate, softmax, handle):
            owned.close()


@pytest.mark.gpu
def test_warm_up_makes_and_drops_one_plan(g):
    """cublaslt.warm_up (issue 41: the fused engine's evaluation thread pays cuBLASLt's first heuristic query) runs
    on a real handle and workspace without error and leaves the handle usable."""
    lt.warm_up(g.handle, g.workspace)
    with build(g, 8, 8, 8) as plan:
        assert plan.describe().startswith("Matmul m=8")
