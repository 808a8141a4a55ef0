"""HetLoRA's maths: the tail of a client's rank, its norm (the self-pruning regulariser), pruning, and
the sparsity-weighted aggregation of zero-padded adapters (numpy; the regulariser also in torch)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedtune.algorithms.hetrank.maths import lora_pairs, products, zero_pad


def tail_start(rank: int, gamma: float, min_rank: int) -> int:
    """k = max(min_rank, floor(gamma * r)): the tail of rank r is ranks k..r-1, and pruning keeps k
    (k = r: no tail, e.g. r = min_rank)."""
    return min(rank, max(min_rank, math.floor(gamma * rank)))


def tail_norm(adapter: Mapping[str, np.ndarray], start: int, stop: int) -> float:
    """sum_m ||B_m[:, start:stop] A_m[start:stop]||_F over the LoRA modules m (0 for an empty tail)."""
    total = 0.0
    for a_key, b_key in lora_pairs(list(adapter)).values():
        a = adapter[a_key][start:stop].astype(np.float64)
        b = adapter[b_key][:, start:stop].astype(np.float64)
        total += float(np.linalg.norm(b @ a))
    return total


def tail_penalty(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], start: int, stop: int) -> torch.Tensor:
    """``tail_norm`` of (A, B) tensor pairs, differentiable (its gradient at a zero tail is zero)."""
    terms = [torch.linalg.matrix_norm(b[:, start:stop] @ a[start:stop]) for a, b in pairs]
    return torch.stack(terms).sum()


def prunes(previous: float | None, current: float) -> bool:
    """Self-pruning's rule: prune once the tail's norm fell below the client's previous round's value."""
    return previous is not None and current < previous


def sparsity_weights(adapters: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Module -> p (n,): p_i = ||B_i A_i||_F / sum_j ||B_j A_j||_F over the n clients' adapters; equal
    weights where every product is zero (nothing to tell the clients apart)."""
    norms: dict[str, list[float]] = {}
    for adapter in adapters:
        for module, product in products(adapter).items():
            norms.setdefault(module, []).append(float(np.linalg.norm(product)))
    weights: dict[str, np.ndarray] = {}
    for module, values in norms.items():
        array = np.asarray(values)
        total = array.sum()
        weights[module] = array / total if total > 0 else np.full(len(array), 1.0 / len(array))
    return weights


def sparsity_weighted_mean(
    adapters: Sequence[Mapping[str, np.ndarray]], full_rank: int
) -> dict[str, np.ndarray]:
    """Zero-pad each adapter (its own rank) to ``full_rank`` and average A and B per module with the
    ``sparsity_weights``: A = sum_i p_i pad(A_i), B = sum_i p_i pad(B_i). Dtypes of the first adapter."""
    if not adapters:
        raise ValueError("the sparsity-weighted mean needs at least one adapter")
    weights = sparsity_weights(adapters)
    padded = [zero_pad(adapter, full_rank) for adapter in adapters]
    mean: dict[str, np.ndarray] = {}
    for module, (a_key, b_key) in lora_pairs(list(padded[0])).items():
        for key in (a_key, b_key):
            total = sum(
                p * adapter[key].astype(np.float64)
                for p, adapter in zip(weights[module], padded, strict=True)
            )
            mean[key] = np.asarray(total).astype(padded[0][key].dtype)
    return mean
