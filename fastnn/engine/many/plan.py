"""Plans of the many-model engines, pure Python (testable on the CPU): which models share a stream of minibatches.

A *group* is the set of models with one mask (one set of training rows): a separate fit of each would read the same
rows. A *stream* is a group at one epoch index: its models read the same minibatch at every step (the shuffle is
keyed by (shuffle_seed, epoch) and permutes the group's rows), so a GPU engine gathers it once for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Streams", "mask_groups", "streams"]


def mask_groups(masks: np.ndarray | None, count: int) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """(group of each model (K,) int64, each group's rows as ascending int64 indices) of bool masks (K, N); models
    with equal masks share a group (numbered in order of first appearance). None: one group, every row."""
    if masks is None:
        return np.zeros(count, dtype=np.int64), None
    ids: dict[bytes, int] = {}
    group = np.empty(count, dtype=np.int64)
    rows: list[np.ndarray] = []
    for k in range(count):
        key = np.packbits(masks[k]).tobytes()
        if key not in ids:
            ids[key] = len(rows)
            rows.append(np.flatnonzero(masks[k]).astype(np.int64))
        group[k] = ids[key]
    return group, rows


@dataclass(frozen=True)
class Streams:
    """The streams of one epoch: stream s reads group `group[s]`'s rows in the order of epoch `epoch[s]`, and model
    k (active) reads stream `of_model[k]` (-1 for a model that does not train)."""

    group: np.ndarray  #: (S,) int64
    epoch: np.ndarray  #: (S,) int64
    of_model: np.ndarray  #: (K,) int64

    @property
    def count(self) -> int:
        return int(self.group.size)

    def models(self, s: int) -> np.ndarray:
        """The models that read stream s, ascending."""
        return np.flatnonzero(self.of_model == s)


def streams(group: np.ndarray, epochs: np.ndarray, active: np.ndarray) -> Streams:
    """The streams of the active models: one per distinct (group, epoch), in order of first appearance."""
    ids: dict[tuple[int, int], int] = {}
    of_model = np.full(group.size, -1, dtype=np.int64)
    for k in np.flatnonzero(active):
        key = (int(group[k]), int(epochs[k]))
        of_model[k] = ids.setdefault(key, len(ids))
    keys = list(ids)
    return Streams(group=np.array([g for g, _ in keys], dtype=np.int64),
                   epoch=np.array([e for _, e in keys], dtype=np.int64), of_model=of_model)  # fmt: skip
