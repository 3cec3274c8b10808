"""Engines: the NumPy reference (`device="cpu"`) and the CUDA-graph engine (`device="cuda"`)."""

from .base import PRECISIONS, Engine, EngineConfig, EpochStats, batch_slices, steps_per_epoch

__all__ = ["PRECISIONS", "Engine", "EngineConfig", "EpochStats", "batch_slices", "steps_per_epoch"]
