"""Secure aggregation's quantisation: float updates to integers the masked sum can carry exactly."""

from __future__ import annotations

import numpy as np

MODULUS_BITS = 32
"""Masked vectors live in Z_(2^32): uint32 arithmetic wraps exactly."""


def quantize(values: np.ndarray, clip_range: float, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Values clipped to [-R, R], mapped to {0, ..., 2^bits - 1} with unbiased stochastic rounding."""
    levels = (1 << bits) - 1
    scaled = (np.clip(values.astype(np.float64), -clip_range, clip_range) + clip_range) * (
        levels / (2 * clip_range)
    )
    low = np.floor(scaled)
    rounded = low + (rng.random(scaled.shape) < scaled - low)
    return np.clip(rounded, 0, levels).astype(np.uint32)


def dequantize_sum(total: np.ndarray, count: int, clip_range: float, bits: int) -> np.ndarray:
    """The sum of ``count`` dequantised vectors from the sum of their quantised ones (exact integers)."""
    levels = (1 << bits) - 1
    return total.astype(np.float64) * (2 * clip_range / levels) - count * clip_range


def quantization_step(clip_range: float, bits: int) -> float:
    """The width of one quantisation level: 2R / (2^bits - 1)."""
    return 2 * clip_range / ((1 << bits) - 1)
