"""PerFIT's maths: the expanded rank and budgets, the importance scores and the search's schedule and
selection (Alg. 1; the search on a model is ``search``), the masked aggregation (Alg. 3).

Arrays are keyed by peft's adapter state-dict keys: a module's ``lora_A`` is ``[r_e, d_in]``, its
``lora_B`` ``[d_out, r_e]``; a mask is a boolean array of the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedtune.algorithms.perfit.config import Importance
from fedtune.fl.aggregate import masked_average, masked_median


def expanded_rank(rank: int, sparsity: float) -> int:
    """r_e = round(r / (1 - s)): 8 -> 12 at s = 0.33, 16 at s = 0.5."""
    return max(rank, round(rank / (1 - sparsity)))


def budget_rank(budgets: Sequence[int], index: int, rank_e: int) -> int:
    """The budget (a rank) of the client at ``index`` in the client order: round-robin over ``budgets``."""
    rank = budgets[index % len(budgets)]
    if rank > rank_e:
        raise ValueError(f"perfit.budgets rank {rank} exceeds the expanded rank {rank_e}")
    return rank


def kept_count(shapes: Mapping[str, tuple[int, ...]], rank: int) -> int:
    """Entries of a rank-``rank`` LoRA on the same modules: rank x (d_in + d_out) summed over modules."""
    return sum(rank * (shape[1] if "lora_A" in key else shape[0]) for key, shape in shapes.items())


def keep_schedule(total: int, final: int, step: int, steps: int) -> int:
    """Entries kept after search step ``step`` of ``steps``: round(total (final / total)^(step / steps)).

    The pruned fraction ``1 - (final / total)^(t / T_p)`` is the paper's ``1 - (1 - s)^(t / T_p)``;
    the last step keeps exactly ``final``.
    """
    if step >= steps:
        return final
    return max(final, round(total * (final / total) ** (step / steps)))


def importance_scores(
    weight: np.ndarray, grad: np.ndarray, fisher: np.ndarray, kind: Importance
) -> np.ndarray:
    """Per-entry importance (eq. 2-4): first |g w|, second |w H w|, mixed |g w - w H w / 2|; H = Fisher.

    All four arrays have the module's shape.
    """
    first = grad * weight
    second = weight * fisher * weight
    if kind == "first":
        return np.abs(first)
    if kind == "second":
        return np.abs(second)
    return np.abs(first - 0.5 * second)


def top_entries(
    scores: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray], count: int
) -> dict[str, np.ndarray]:
    """Masks keeping the ``count`` highest scores among the entries ``current`` holds, over all keys
    together; ties go to the earlier entry (keys in order, entries in C order)."""
    keys = list(scores)
    flat = np.concatenate([np.where(current[k], scores[k], -np.inf).ravel() for k in keys])
    if count > int(np.isfinite(flat).sum()):
        raise ValueError(f"cannot keep {count} entries: only {int(np.isfinite(flat).sum())} are left")
    order = np.argsort(-flat, kind="stable")[:count]
    chosen = np.zeros(flat.size, dtype=bool)
    chosen[order] = True
    masks, offset = {}, 0
    for key in keys:
        size = scores[key].size
        masks[key] = chosen[offset : offset + size].reshape(scores[key].shape)
        offset += size
    return masks


def symmetric_init(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """A and B ~ N(0, 1/d), d the adapted layer's input width (A's second dimension); float32."""
    rng = np.random.default_rng(seed)
    width: dict[str, int] = {}
    for key, shape in shapes.items():
        if "lora_A" in key:
            width[key.replace("lora_A", "lora_B")] = shape[1]
            width[key] = shape[1]
    return {
        key: rng.normal(0.0, 1.0 / np.sqrt(width[key]), size=shape).astype(np.float32)
        for key, shape in shapes.items()
    }


def masked_aggregate(
    states: Sequence[Mapping[str, np.ndarray]],
    masks: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    median: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Alg. 3's per-entry combination over each entry's holders: the weighted mean, or with ``median``
    (``fed.aggregator: median``) the unweighted median; ``(combined, held)`` as ``masked_average``."""
    return masked_median(states, masks) if median else masked_average(states, masks, weights)


def update_global(
    global_module: Mapping[str, np.ndarray],
    states: Sequence[Mapping[str, np.ndarray]],
    masks: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    median: bool = False,
) -> dict[str, np.ndarray]:
    """Alg. 3 on the server's dense expanded module G (sec. 4.1 step 4).

    global_module: G, one array per adapter key. states, masks: the round's K trained clients' dense
    values (zero outside their mask) and boolean masks, each of G's shapes. weights: K example counts.
    Every entry some client holds becomes the weighted mean over the clients holding it; an entry no
    client of this round holds keeps G's value; ``median``: the per-entry median over the holders
    instead (``fed.aggregator: median``). Returns the new G (G's dtypes).
    """
    mean, held = masked_aggregate(states, masks, weights, median)
    return {
        key: np.where(held[key] > 0, mean[key], value).astype(value.dtype)
        for key, value in global_module.items()
    }


def thinly_held_share(masks: Sequence[Mapping[str, np.ndarray]], protects_from: int = 3) -> float:
    """The share of the entries some client holds that fewer than ``protects_from`` clients hold.

    masks: the round's K boolean masks, one array per adapter key. A per-entry median over one or two
    holders cannot outvote a lying holder (``fed.aggregator: median`` protects an entry only when at
    least three clients hold it), so this is the share of the aggregate a single liar can still move.
    """
    held = total = 0
    for key in masks[0] if masks else {}:
        count = sum(np.asarray(mask[key], dtype=np.int64) for mask in masks)
        held += int(np.count_nonzero(count))
        total += int(np.count_nonzero((count > 0) & (count < protects_from)))
    return total / held if held else 0.0
