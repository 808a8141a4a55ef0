"""FedKSeed's maths: seeded perturbations, the two-point scalar estimate, per-seed sums, the replay
of the seed/scalar history and the seed probabilities (pure numpy/torch; no model, no file).

Shapes: ``params`` is a sequence of tensors updated in place (a model's parameters in a fixed order);
``seeds`` is ``[K]`` int64; a history is ``[R, K]`` float64 (row r: round r+1's per-seed scalars).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

SEED_HIGH = 2**31 - 1
SCALAR_BYTES = 8
"""A scalar on the wire is a float64."""


def candidate_seeds(run_seed: int, k: int) -> np.ndarray:
    """The run's ``k`` distinct candidate seeds ``[k]`` int64 in [1, 2^31), a function of ``run_seed``."""
    rng = np.random.default_rng([run_seed, 0x5EED])
    return np.sort(rng.choice(SEED_HIGH - 1, size=k, replace=False).astype(np.int64) + 1)


def add_direction(params: Sequence[torch.Tensor], seed: int, scale: float) -> None:
    """``params += scale * z(seed)`` in place; z ~ N(0, I) regenerated from ``seed`` one tensor at a time
    (never stored whole), in each tensor's dtype and on its device."""
    generator: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for param in params:
            device = param.device
            if device not in generator:
                generator[device] = torch.Generator(device=device).manual_seed(int(seed))
            noise = torch.randn(param.shape, generator=generator[device], dtype=param.dtype, device=device)
            param.add_(noise, alpha=scale)


def projected_gradient(loss_plus: float, loss_minus: float, eps: float) -> float:
    """The two-point estimate of the derivative along z: (L(w + eps z) - L(w - eps z)) / (2 eps)."""
    return (loss_plus - loss_minus) / (2.0 * eps)


def accumulate_per_seed(indices: Sequence[int], scalars: Sequence[float], k: int) -> np.ndarray:
    """The ``[k]`` float64 sums of ``scalars`` per seed index (a seed never drawn sums to 0)."""
    sums = np.zeros(k, dtype=np.float64)
    np.add.at(sums, np.asarray(indices, dtype=np.int64), np.asarray(scalars, dtype=np.float64))
    return sums


def replay_round(params: Sequence[torch.Tensor], seeds: np.ndarray, scalars: np.ndarray, lr: float) -> None:
    """One round of the history: ``w <- w - lr sum_k scalars[k] z(seeds[k])``, seed by seed in order
    (a zero scalar is skipped), so every party that replays it gets the same bits."""
    for seed, scalar in zip(seeds.tolist(), scalars.tolist(), strict=True):
        if scalar != 0.0:
            add_direction(params, seed, -lr * scalar)


def replay(params: Sequence[torch.Tensor], seeds: np.ndarray, history: np.ndarray, lr: float) -> None:
    """Every round of ``history`` ``[R, K]`` in order (``replay_round``)."""
    for row in history:
        replay_round(params, seeds, row, lr)


def seed_probabilities(history: np.ndarray, alpha: float) -> np.ndarray:
    """The paper's non-uniform seed sampling: ``[K]`` probabilities from a history ``[R, K]``.

    psi_k = mean_r |history[r, k]| (a seed's importance), min-max normalised to [0, 1], then
    p = softmax(alpha psi). Uniform without history or when every seed is as important.
    """
    k = history.shape[1]
    if len(history) == 0:
        return np.full(k, 1.0 / k)
    importance = np.abs(history).mean(axis=0)
    spread = importance.max() - importance.min()
    if spread <= 0 or not np.isfinite(spread):
        return np.full(k, 1.0 / k)
    logits = alpha * (importance - importance.min()) / spread
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def foreign_seed(returned: np.ndarray, sent: np.ndarray) -> str | None:
    """Why ``returned`` ``[K]`` is not the round's seeds ``sent`` ``[K]`` in order (naming the first seed
    that differs), or None when it is."""
    if returned.shape != sent.shape:
        return f"{returned.size} seeds, expected the round's {sent.size}"
    for position, (got, expected) in enumerate(zip(returned.tolist(), sent.tolist(), strict=True)):
        if got != expected:
            where = "not a seed of this round" if got not in set(sent.tolist()) else "out of place"
            return f"seed {got} at position {position} is {where} (expected {expected})"
    return None


def history_is_cheaper(rows: int, k: int, model_bytes: int) -> bool:
    """Whether catching up by ``rows`` rounds of K float64 scalars costs no more bytes than the model."""
    return rows * k * SCALAR_BYTES <= model_bytes
