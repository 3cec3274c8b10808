"""A trained network handed to PyTorch: the same layers as a `torch.nn.Sequential`, imported only when asked for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._model import MLP

__all__ = ["to_torch"]


def to_torch(model: MLP, params: Mapping[str, np.ndarray]) -> Any:
    """`model` with the parameters `params` (keyed like `Trainer.state_dict`) as a float32 `torch.nn.Sequential`
    (Linear, ReLU or GELU(tanh), ..., Linear) on the CPU.

    Raises:
        ImportError: PyTorch is not installed.
    """
    try:
        import torch
    except ImportError:
        raise ImportError("Trainer.to_torch() needs PyTorch: pip install torch") from None
    layers: list[Any] = []
    for i, (fan_in, fan_out) in enumerate(model.layers):
        if i:
            layers.append(torch.nn.ReLU() if model.activation == "relu" else torch.nn.GELU(approximate="tanh"))
        layers.append(torch.nn.Linear(fan_in, fan_out))
    net = torch.nn.Sequential(*layers)
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()})
    return net
