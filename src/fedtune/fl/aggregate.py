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


def coordinate_median(states: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The median of every coordinate over K same-keyed states (unweighted: a weight is a claim a client
    makes, and a robust rule must not let one claim move the result). Keeps each array's dtype."""
    if not states:
        raise ValueError("coordinate_median needs at least one state")
    return {
        key: np.median(np.stack([s[key].astype(np.float64) for s in states]), axis=0).astype(first.dtype)
        for key, first in states[0].items()
    }


def trimmed_mean(states: Sequence[Mapping[str, np.ndarray]], trim: float) -> dict[str, np.ndarray]:
    """Per coordinate, the mean of the K values left after dropping the ``floor(trim K)`` lowest and as
    many highest (unweighted). ``trim`` in [0, 0.5); 0 is the plain mean."""
    if not states:
        raise ValueError("trimmed_mean needs at least one state")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    cut = int(np.floor(trim * len(states)))
    result = {}
    for key, first in states[0].items():
        ordered = np.sort(np.stack([s[key].astype(np.float64) for s in states]), axis=0)
        result[key] = ordered[cut : len(states) - cut].mean(axis=0).astype(first.dtype)
    return result


def robust_aggregate(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float], aggregator: str, trim: float
) -> dict[str, np.ndarray]:
    """``fed.aggregator``: ``mean`` (weighted by ``weights``), ``median`` or ``trimmed_mean``."""
    if aggregator == "mean":
        return weighted_average(states, weights)
    if aggregator == "median":
        return coordinate_median(states)
    if aggregator == "trimmed_mean":
        return trimmed_mean(states, trim)
    raise ValueError(f"unknown aggregator {aggregator!r}: mean, median or trimmed_mean")


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


def masked_average(
    states: Sequence[Mapping[str, np.ndarray]],
    masks: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-entry weighted mean over the clients whose mask holds the entry (PerFIT's Alg. 3).

    states, masks: K dicts with the same keys; ``masks[k][key]`` is a boolean array of
    ``states[k][key]``'s shape. weights: K positive numbers. For every entry e of every key,
    ``mean[e] = sum_k w_k m_k[e] x_k[e] / sum_k w_k m_k[e]``, and ``held[e] = sum_k m_k[e]`` (how many
    clients hold e). An entry no client holds is 0 in ``mean`` and 0 in ``held``.

    Returns ``(mean, held)``; ``mean`` keeps each array's dtype, ``held`` is int32.
    """
    if not states:
        raise ValueError("masked_average needs at least one state")
    if not len(states) == len(masks) == len(weights):
        raise ValueError(f"{len(states)} states, {len(masks)} masks, {len(weights)} weights")
    if any(float(w) <= 0 for w in weights):
        raise ValueError("masked_average weights must be positive")
    mean, held = {}, {}
    for key, first in states[0].items():
        numerator = np.zeros(first.shape, dtype=np.float64)
        denominator = np.zeros(first.shape, dtype=np.float64)
        count = np.zeros(first.shape, dtype=np.int32)
        for state, mask, weight in zip(states, masks, weights, strict=True):
            entry = np.asarray(mask[key], dtype=bool)
            if entry.shape != first.shape:
                raise ValueError(f"mask of '{key}' has shape {entry.shape}, the array {first.shape}")
            numerator += np.where(entry, state[key].astype(np.float64) * float(weight), 0.0)
            denominator += entry * float(weight)
            count += entry
        safe = np.where(denominator > 0, denominator, 1.0)
        mean[key] = np.where(denominator > 0, numerator / safe, 0.0).astype(first.dtype)
        held[key] = count
    return mean, held


def masked_median(
    states: Sequence[Mapping[str, np.ndarray]], masks: Sequence[Mapping[str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``masked_average``'s robust counterpart: every entry's median over the clients whose mask holds
    it (unweighted); ``(median, held)``, an entry no client holds is 0 with ``held`` 0."""
    if not states or len(states) != len(masks):
        raise ValueError(f"{len(states)} states, {len(masks)} masks")
    median, held = {}, {}
    for key, first in states[0].items():
        values = np.stack([s[key].astype(np.float64) for s in states])
        held_by = np.stack([np.asarray(m[key], dtype=bool) for m in masks])
        count = held_by.sum(axis=0).astype(np.int32)
        # An entry no client holds takes 0 from every client, so no slice is all NaN.
        filled = np.where(held_by, values, np.where(count == 0, 0.0, np.nan))
        median[key] = np.nanmedian(filled, axis=0).astype(first.dtype)
        held[key] = count
    return median, held


def apply_mask(state: Mapping[str, np.ndarray], mask: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state * mask`` key by key (what a receiver of a masked aggregate keeps)."""
    return {
        key: np.where(np.asarray(mask[key], dtype=bool), value, 0).astype(value.dtype)
        for key, value in state.items()
    }


def subset_average(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Weighted mean per key over the clients that sent that key (clients may send different keys).

    A key's shape must agree among the clients that sent it. The result holds every key any client
    sent; each key's weights are renormalised over its senders.
    """
    if not states:
        raise ValueError("subset_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    keys = list(dict.fromkeys(key for state in states for key in state))
    result = {}
    for key in keys:
        senders = [(state[key], w) for state, w in zip(states, weights, strict=True) if key in state]
        shapes = {tuple(value.shape) for value, _ in senders}
        if len(shapes) > 1:
            raise ValueError(f"'{key}' arrives with different shapes: {sorted(shapes)}")
        result[key] = weighted_average([{key: v} for v, _ in senders], [w for _, w in senders])[key]
    return result


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """A boolean array as packed bits (uint8, 1 bit per entry, C order): what a mask costs on the wire."""
    return np.packbits(np.asarray(mask, dtype=bool).ravel())


def unpack_mask(bits: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of ``pack_mask``."""
    count = int(np.prod(shape))
    if bits.dtype != np.uint8 or bits.size != (count + 7) // 8:
        raise ValueError(f"packed mask of {bits.size} {bits.dtype} bytes does not fit shape {shape}")
    return np.unpackbits(bits, count=count).astype(bool).reshape(shape)


def gather_masked(state: Mapping[str, np.ndarray], mask: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entries of each array that its mask holds, flattened in C order (a ragged upload)."""
    return {key: value[np.asarray(mask[key], dtype=bool)] for key, value in state.items()}


def scatter_masked(values: Mapping[str, np.ndarray], mask: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of ``gather_masked``: zeros outside the mask. A length mismatch is an error."""
    result = {}
    for key, entries in values.items():
        where = np.asarray(mask[key], dtype=bool)
        if entries.ndim != 1 or entries.size != int(where.sum()):
            raise ValueError(f"'{key}': {entries.size} values for a mask holding {int(where.sum())} entries")
        full = np.zeros(where.shape, dtype=entries.dtype)
        full[where] = entries
        result[key] = full
    return result
