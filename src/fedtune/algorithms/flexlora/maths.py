"""FlexLoRA's server maths (pure numpy): the data-weighted mean of the clients' full-size products and
its redistribution by truncated SVD."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedtune.algorithms.hetrank.maths import lora_pairs, products


def product_mean(
    adapters: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """W_m = sum_i p_i B_i A_i per module m (d_out, d_in), p_i = weights_i / sum(weights); float64.

    Each adapter may hold its own rank: only its product, of the full size, enters the mean.
    """
    total = float(sum(weights))
    if not adapters or total <= 0:
        raise ValueError("the product mean needs at least one adapter and a positive total weight")
    mean: dict[str, np.ndarray] = {}
    for adapter, weight in zip(adapters, weights, strict=True):
        for module, product in products(adapter).items():
            mean[module] = mean.get(module, 0.0) + (weight / total) * product
    return mean


def svd_factors(
    mean: Mapping[str, np.ndarray], keys: Sequence[str], rank: int, dtype: np.dtype = np.dtype(np.float32)
) -> dict[str, np.ndarray]:
    """The best rank-``rank`` factorisation of each module's W = U S V^T (Eckart-Young): B = U_r S_r
    (d_out, r), A = V_r^T (r, d_in), under the adapter ``keys``; beyond rank(W) the columns of B are
    zero (zero singular values), and beyond min(d_out, d_in) both factors are.

    The first r' ranks of the result are the rank-r' factorisation, so one SVD serves every client rank.
    """
    adapter: dict[str, np.ndarray] = {}
    for module, (a_key, b_key) in lora_pairs(keys).items():
        u, s, vt = np.linalg.svd(mean[module], full_matrices=False)
        kept = min(rank, s.shape[0])
        b = np.zeros((u.shape[0], rank))
        a = np.zeros((rank, vt.shape[1]))
        b[:, :kept] = u[:, :kept] * s[:kept]
        a[:kept] = vt[:kept]
        adapter[a_key], adapter[b_key] = a.astype(dtype), b.astype(dtype)
    return adapter
