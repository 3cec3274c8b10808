"""The GPU engine's plan: pure arithmetic on shapes (no GPU), so it is tested on the CPU.

Parameters live in one flat buffer, each tensor padded to `ALIGN` elements (256 bytes of fp32:
cuBLASLt wants aligned operand and bias pointers), in `param_names` order; gradients and optimizer
state use the same layout, so one elementwise kernel updates every parameter at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._errors import ConfigError
from .._model import MLP, param_names

__all__ = ["ALIGN", "ParamLayout", "PrecisionSpec", "gelu_aux_ld", "param_layout", "precision_spec", "relu_aux_ld"]

ALIGN = 128  # elements: 256 bytes even for fp16 (cuBLASLt plans promise 256-byte aligned pointers)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class ParamLayout:
    """Where each named parameter sits in the flat buffers (offsets and sizes in elements)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    total: int  # padded element count of one flat buffer
    shards: int = 1  # every layer's range splits into this many equal, ALIGN-aligned parts

    def layer_range(self, layer: int) -> tuple[int, int]:
        """[start, stop) of `layer`'s weight and bias (with their padding) in the flat buffers."""
        start = self.offsets[2 * layer]
        stop = self.offsets[2 * layer + 2] if 2 * layer + 2 < len(self.offsets) else self.total
        return start, stop

    def shard(self, layer: int, rank: int) -> tuple[int, int]:
        """(start, count) of part `rank` of `layer`'s range: what that rank of a sharded update owns."""
        start, stop = self.layer_range(layer)
        count = (stop - start) // self.shards
        return start + rank * count, count

    def tensor_runs(self, first: int, count: int) -> list[tuple[int, int, bool]]:
        """[first, first + count) cut at the tensors' boundaries: (start, count, is_bias) of each piece, a tensor's
        padding with it; what an update whose biases decay otherwise than the weights launches one by one."""
        ends = (*self.offsets[1:], self.total)
        runs = []
        for i, (lo, hi) in enumerate(zip(self.offsets, ends)):
            a, b = max(lo, first), min(hi, first + count)
            if a < b:
                runs.append((a, b - a, self.names[i].endswith(".bias")))
        return runs

    def slot(self, name: str) -> tuple[int, tuple[int, ...]]:
        i = self.names.index(name)
        return self.offsets[i], self.shapes[i]

    def pack(self, arrays: dict[str, np.ndarray], dtype: type) -> np.ndarray:
        """One flat array of `dtype` holding `arrays` at their offsets, zero padding between."""
        flat = np.zeros(self.total, dtype=dtype)
        for off, a in self.placed(arrays, dtype):
            flat[off : off + a.size] = a.ravel()
        return flat

    def placed(self, arrays: dict[str, np.ndarray], dtype: type) -> list[tuple[int, np.ndarray]]:
        """(offset, tensor) of each of `arrays` as a C-contiguous array of `dtype`: the caller's own array when it is
        one already. What `pack` writes, for copying each tensor to its place without a flat copy of them all.

        Raises:
            ConfigError: a tensor's shape is not the model's (every shape is checked before this returns).
        """
        out = []
        for name, off, shape in zip(self.names, self.offsets, self.shapes):
            a = np.asarray(arrays[name])
            if a.shape != shape:
                raise ConfigError(f"state[{name!r}] has shape {a.shape}, expected {shape}")
            out.append((off, np.ascontiguousarray(a, dtype=dtype)))
        return out

    def unpack(self, flat: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
        """float32 copies of each tensor in `flat`, keyed `prefix + name`."""
        out = {}
        for name, off, shape in zip(self.names, self.offsets, self.shapes):
            n = int(np.prod(shape))
            out[prefix + name] = flat[off : off + n].astype(np.float32).reshape(shape)
        return out


def param_layout(model: MLP, shards: int = 1) -> ParamLayout:
    """Each tensor at an ALIGN-aligned offset; with shards > 1 each layer's range (weight, bias) is padded to a
    multiple of ALIGN * shards, so that it splits into `shards` equal parts, each ALIGN-aligned (a sharded update's
    reduce-scatter and all-gather need equal counts)."""
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in model.layers:
        shapes += [(fan_out, fan_in), (fan_out,)]
    offsets, off = [], 0
    for i, shape in enumerate(shapes):
        offsets.append(off)
        off += _round_up(int(np.prod(shape)), ALIGN)
        if i % 2:  # a layer's bias: its range ends here
            off = _round_up(off, ALIGN * shards)
    return ParamLayout(tuple(param_names(model)), tuple(shapes), tuple(offsets), off, shards)


@dataclass(frozen=True)
class PrecisionSpec:
    """Storage types of one precision mode and the kernel variants that go with them."""

    name: str
    operand: type  # GEMM A/B operands and hidden activations
    grad: type  # gradients (what the GEMMs write)
    param: type  # stored (master) parameters
    logits: type  # last layer's output, softmax and probabilities
    half_copy: bool  # an fp16 copy of fp32 master weights feeds the GEMMs
    compute_16f: bool  # CUBLAS_COMPUTE_16F (fp16 accumulation) instead of COMPUTE_32F

    @property
    def gather_kernel_suffix(self) -> str:
        return "f16" if self.operand == np.float16 else "f32"

    @property
    def update_kernel(self) -> str:
        return f"update_{_tag(self.param)}_{_tag(self.grad)}"

    def update_gather_kernel(self, src: str) -> str:
        """The update fused with the next batch's gather from `src` ("u8" or "f32") data."""
        return f"{self.update_kernel}_gather_{src}_{self.gather_kernel_suffix}"

    @property
    def loss_kernel(self) -> str:
        return f"xent_{_tag(self.logits)}_{_tag(self.operand)}"

    @property
    def mse_kernel(self) -> str:
        """native/loss.cu's squared-error step of a regression (loss "mse"), in the same types as loss_kernel."""
        return f"mse_{_tag(self.logits)}_{_tag(self.operand)}"


def _tag(t: type) -> str:
    return "f16" if t == np.float16 else "f32"


_SPECS = {
    # fp16 operands with fp32 accumulation; fp32 master weights and optimizer state; the logits and
    # the loss in fp32. Gradients are fp16 as the GEMMs write them, as under PyTorch AMP.
    "mixed": PrecisionSpec("mixed", np.float16, np.float16, np.float32, np.float32, True, False),
    # fp16 weights, fp16 accumulation (CUBLAS_COMPUTE_16F); the loss kernel still computes in fp32.
    "fp16": PrecisionSpec("fp16", np.float16, np.float16, np.float16, np.float16, False, True),
    # fp32 everywhere, true fp32 GEMMs (CUBLAS_COMPUTE_32F, no TF32): the mode tests compare tightly.
    "fp32": PrecisionSpec("fp32", np.float32, np.float32, np.float32, np.float32, False, False),
}


def precision_spec(precision: str) -> PrecisionSpec:
    try:
        return _SPECS[precision]
    except KeyError:
        raise ConfigError(f"precision must be one of {tuple(_SPECS)}, got {precision!r}") from None


def relu_aux_ld(rows: int) -> int:
    """Leading dimension of cuBLASLt's ReLU bit-mask, in bits: a multiple of 128, >= rows."""
    return _round_up(rows, 128)


def gelu_aux_ld(rows: int) -> int:
    """Leading dimension of cuBLASLt's GELU pre-activation buffer, in elements: a multiple of 8."""
    return _round_up(rows, 8)
