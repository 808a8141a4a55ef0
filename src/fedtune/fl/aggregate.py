"""Aggregation maths: pure functions over numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def weighted_average(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Weighted mean of same-keyed arrays: sum_k w_k x_k / sum_k w_k, accumulated in float64.

    states: K dicts of arrays with identical keys/shapes; weights: K non-negative numbers (e.g.
    example counts). The result keeps each array's dtype.
    """
    if not states:
        raise ValueError("weighted_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights sum to zero")
    result = {}
    for key, first in states[0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for state, weight in zip(states, weights, strict=True):
            acc += state[key].astype(np.float64) * (float(weight) / total)
        result[key] = acc.astype(first.dtype)
    return result


def server_step(
    current: Mapping[str, np.ndarray], average: Mapping[str, np.ndarray], server_lr: float
) -> dict[str, np.ndarray]:
    """x + lr * (avg - x): FedAvg with a server learning rate (lr = 1 is plain FedAvg)."""
    if server_lr == 1.0:
        return {key: np.array(value, copy=True) for key, value in average.items()}
    return {
        key: (value + server_lr * (average[key] - value)).astype(value.dtype)
        for key, value in current.items()
    }
