"""The many-model GPU engine's plan, pure Python (no GPU): where each model's parameters live, the tables a data set
and an epoch upload, and the rows of each step. native/many.cu reads exactly these; tests/test_many_gpu_plan.py
checks them on the CPU against the NumPy definitions (fastnn/_shuffle.py, engine/base.py's steps_per_epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...._model import MLP, param_names
from ...._optim import Optimizer
from ...._shuffle import feistel_bits
from ..plan import Streams

__all__ = [
    "GroupTables", "ModelLayout", "StreamTables", "group_tables", "lr_rows", "model_layout", "optim_records",
    "row_groups", "rows_at", "samples", "stream_tables", "xent_tile", "XENT_TILE_FLOATS", "XENT_TILE_MODELS",
]  # fmt: skip

#: Floats each tensor's block (of all K models) is rounded up to: 256 bytes, the alignment cuBLASLt's plans promise.
BLOCK_ALIGN = 64


@dataclass(frozen=True)
class ModelLayout:
    """The training state of K models, tensor-major: tensor `names[t]` (torch's name and layout) of model k is the
    floats [starts[t] + k * sizes[t], + sizes[t]) of a (total,) array; the blocks follow param_names' order, each
    starting on BLOCK_ALIGN floats. So a layer's weights of all K models are one (K * out, in) matrix."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]  #: floats of one model's tensor
    starts: tuple[int, ...]  #: each block's first float, then the total
    models: int

    @property
    def total(self) -> int:
        return self.starts[-1]

    def at(self, name: str, k: int) -> int:
        """The first float of model k's tensor `name`."""
        t = self.names.index(name)
        return self.starts[t] + k * self.sizes[t]

    def pack(self, states: list[dict[str, np.ndarray]], prefix: str = "") -> np.ndarray:
        """(total,) float32: each model's tensors `prefix + name` in place (absent ones, and padding, zero)."""
        out = np.zeros(self.total, dtype=np.float32)
        for k, state in enumerate(states):
            for name in self.names:
                value = state.get(prefix + name)
                if value is not None:
                    at = self.at(name, k)
                    out[at : at + self.sizes[self.names.index(name)]] = np.asarray(value, np.float32).reshape(-1)
        return out

    def unpack(self, flat: np.ndarray, k: int, prefix: str = "") -> dict[str, np.ndarray]:
        """Model k's tensors of a (total,) array, keyed `prefix + name` (copies)."""
        return {prefix + n: flat[self.at(n, k) : self.at(n, k) + size].reshape(shape).copy()
                for n, shape, size in zip(self.names, self.shapes, self.sizes)}  # fmt: skip


def model_layout(model: MLP, models: int) -> ModelLayout:
    """The tensor-major layout of `models` copies of `model`'s parameters (param_names order)."""
    names = param_names(model)
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in model.layers:
        shapes += [(fan_out, fan_in), (fan_out,)]
    sizes = tuple(int(np.prod(s)) for s in shapes)
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += -(-(models * size) // BLOCK_ALIGN) * BLOCK_ALIGN
    return ModelLayout(tuple(names), tuple(shapes), sizes, (*starts, at), models)


def rows_at(n: int, step: int, batch: int, drop_last: bool) -> int:
    """Rows of a stream of n rows at `step` (native/many.cu's rows_at): steps_per_epoch's batches, then 0."""
    left = n - step * batch
    if left <= 0:
        return 0
    if left >= batch:
        return batch
    return 0 if drop_last else left


def row_groups(rows: list[np.ndarray] | None, count: int, n: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(group of each model, each group's rows) from per-model row indices (None: one group of all n rows). Models
    given the same array object, or equal rows, share a group."""
    if rows is None:
        return np.zeros(count, dtype=np.int64), [np.arange(n, dtype=np.int64)]
    by_id: dict[int, int] = {}
    by_bytes: dict[bytes, int] = {}
    groups: list[np.ndarray] = []
    group = np.empty(count, dtype=np.int64)
    for k, r in enumerate(rows):
        g = by_id.get(id(r))
        if g is None:
            key = np.asarray(r, dtype=np.int64).tobytes()
            g = by_bytes.setdefault(key, len(groups))
            if g == len(groups):
                groups.append(np.asarray(r, dtype=np.int64))
            by_id[id(r)] = g
        group[k] = g
    return group, groups


def samples(n: int, steps: int, batch: int, drop_last: bool) -> int:
    """Rows a stream of n rows trains on in its first `steps` steps (the NumPy engine's `seen`): the sum of
    rows_at over them, in closed form (a loop of steps per model cost ~0.25 ms an epoch at K = 1,024 x 469 steps)."""
    if drop_last:
        return min(n // batch, steps) * batch
    return min(n, steps * batch)


def lr_rows(lrs: list[np.ndarray | None], active: np.ndarray, width: int) -> np.ndarray:
    """The (K, width) float32 lr table the update reads: row k holds model k's rates of its steps, then zeros.

    Raises:
        ValueError: an active model has no table, or one longer than `width`.
    """
    table = np.zeros((active.size, width), dtype=np.float32)
    for k in np.flatnonzero(active):
        rates = lrs[int(k)]
        if rates is None or rates.size > width:
            raise ValueError(f"model {int(k)} is active but has no learning-rate table of at most {width} steps")
        table[k, : rates.size] = rates
    return table


@dataclass(frozen=True)
class GroupTables:
    """A data set's groups as the gather reads them: rows (concatenated, int32), each group's first entry in it,
    its row count and the half of its Feistel bit count."""

    rows: np.ndarray  #: int32
    offsets: np.ndarray  #: uint64
    n: np.ndarray  #: uint32
    half: np.ndarray  #: uint32

    def steps(self, group: int, batch: int, drop_last: bool) -> int:
        n = int(self.n[group])
        return n // batch if drop_last else -(-n // batch)


def group_tables(groups: list[np.ndarray]) -> GroupTables:
    sizes = [g.size for g in groups]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    return GroupTables(rows=np.concatenate(groups).astype(np.int32), offsets=offsets,
                       n=np.array(sizes, dtype=np.uint32),
                       half=np.array([feistel_bits(s) // 2 for s in sizes], dtype=np.uint32))  # fmt: skip


@dataclass(frozen=True)
class StreamTables:
    """An epoch's (or an evaluation's) streams as the kernels read them."""

    model_stream: np.ndarray  #: int32 (K,), -1: the model does not take part
    stream_group: np.ndarray  #: int32 (S,)
    stream_epoch: np.ndarray  #: uint32 (S,): the epoch's low 32 bits, the shuffle's key
    steps: int  #: steps of the longest stream

    @property
    def count(self) -> int:
        return int(self.stream_group.size)


def stream_tables(streams: Streams, tables: GroupTables, batch: int, drop_last: bool) -> StreamTables:
    steps = max((tables.steps(int(g), batch, drop_last) for g in streams.group), default=0)
    return StreamTables(model_stream=streams.of_model.astype(np.int32), stream_group=streams.group.astype(np.int32),
                        stream_epoch=(streams.epoch & 0xFFFFFFFF).astype(np.uint32), steps=steps)  # fmt: skip


def optim_records(optimizers: tuple[Optimizer, ...]) -> np.ndarray:
    """Each model's native/optim.cuh OptimParams, as a structured array laid out as the C struct (every field 4
    bytes: no padding), from the optimizers' `kernel_params` (the one description)."""
    fields = optimizers[0].kernel_params().c_fields()
    dtype = np.dtype([(name, np.int32 if kind == "i32" else np.float32) for name, kind, _ in fields])
    out = np.zeros(len(optimizers), dtype=dtype)
    for k, opt in enumerate(optimizers):
        for name, _, value in opt.kernel_params().c_fields():
            out[k][name] = value
    return out


#: native/many.cu's XENT_TILE_MODELS: the most models a block of many_xent_tiled.
XENT_TILE_MODELS = 4
#: native/many.cu's XENT_TILE_FLOATS: many_xent_tiled's shared tile of logits (floats).
XENT_TILE_FLOATS = 5120


def xent_tile(models: int, classes: int, sm_count: int) -> int:
    """Models a block of many_xent_tiled: about K / SMs (a block an SM, more blocks than SMs once K >= 2 SMs' worth),
    at most XENT_TILE_MODELS, and at least one row of the tile in its shared memory; 0 where no tile fits (more
    classes than XENT_TILE_FLOATS: many_xent serves)."""
    if classes > XENT_TILE_FLOATS:
        return 0
    return max(1, min(XENT_TILE_MODELS, models // max(1, sm_count), XENT_TILE_FLOATS // classes))
