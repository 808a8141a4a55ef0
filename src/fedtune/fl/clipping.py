"""A client's update (what it returns minus what it was sent), its L2 norm and the one L2 clip that
client-level DP (on the server) and secure aggregation (on each client) both apply.

Everything is computed in float64 over the reference's keys, flat across all tensors together: the
bound is on the whole update, not per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def update_delta(
    state: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``state - reference`` key by key over ``reference``'s keys (float64, ``reference``'s shapes)."""
    return {
        key: np.asarray(state[key], dtype=np.float64) - np.asarray(base, dtype=np.float64)
        for key, base in reference.items()
    }


def l2_norm(update: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of all of ``update``'s arrays as one flat vector."""
    return math.sqrt(sum(float(np.sum(values * values)) for values in update.values()))


def update_norm(state: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """The flat L2 norm of ``state - reference`` over ``reference``'s keys."""
    return l2_norm(update_delta(state, reference))


def clip_l2(update: Mapping[str, np.ndarray], bound: float | None) -> tuple[dict[str, np.ndarray], float]:
    """``(update scaled to flat L2 norm <= bound, its norm before)``; without a bound it is unchanged."""
    norm = l2_norm(update)
    scale = min(1.0, bound / norm) if bound is not None and norm > 0 else 1.0
    return {key: values * scale for key, values in update.items()}, norm
