"""FedAvgM's server step: momentum on the pseudo-gradient (pure numpy)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def momentum_step(
    current: Mapping[str, np.ndarray],
    average: Mapping[str, np.ndarray],
    velocity: Mapping[str, np.ndarray],
    *,
    lr: float,
    momentum: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One server step; returns ``(x_{t+1}, v_t)``. All arrays keyed alike; float64 maths, dtypes kept."""
    new_state, new_velocity = {}, {}
    for key, x in current.items():
        pseudo_gradient = x.astype(np.float64) - average[key].astype(np.float64)
        v = momentum * velocity[key].astype(np.float64) + pseudo_gradient
        new_velocity[key] = v.astype(x.dtype)
        new_state[key] = (x.astype(np.float64) - lr * v).astype(x.dtype)
    return new_state, new_velocity
