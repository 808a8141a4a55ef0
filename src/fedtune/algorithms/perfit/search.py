"""PerFIT's search on a client's model (Alg. 1): the LoRA weights' gradients and Fisher diagonal on
the client's batches, scored and pruned by ``maths`` step by step.

Arrays are keyed by peft's adapter state-dict keys, each of its weight's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.perfit.config import Importance
from fedtune.algorithms.perfit.maths import importance_scores, keep_schedule, top_entries
from fedtune.models.lora import adapter_parameters, load_adapter
from fedtune.train.losses import response_nll

Batch = dict[str, torch.Tensor]


def local_gradients(
    model: Any, weights: Mapping[str, np.ndarray], batches: Sequence[Batch]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The LoRA weights' mean gradient of the response NLL over ``batches`` and the empirical Fisher
    diagonal (mean of the squared per-batch gradients), with ``weights`` loaded; the base is frozen.
    Both float64, each key the shape of its weight."""
    load_adapter(model, weights)
    params = adapter_parameters(model)
    grad = {k: np.zeros(p.shape, dtype=np.float64) for k, p in params.items()}
    fisher = {k: np.zeros(p.shape, dtype=np.float64) for k, p in params.items()}
    device = next(iter(params.values())).device
    model.eval()  # no dropout: the scores measure the model as it is
    for batch in batches:
        model.zero_grad(set_to_none=True)
        nll, count = response_nll(model, {k: v.to(device) for k, v in batch.items()})
        (nll / max(1, count)).backward()
        for key, p in params.items():
            g = p.grad.detach().double().cpu().numpy() if p.grad is not None else 0.0
            grad[key] += g / len(batches)
            fisher[key] += np.square(g) / len(batches)
    model.zero_grad(set_to_none=True)
    return grad, fisher


def search_masks(
    model: Any,
    weights: Mapping[str, np.ndarray],
    batches: Sequence[Batch],
    final: int,
    *,
    steps: int,
    per_step: int,
    importance: Importance,
) -> dict[str, np.ndarray]:
    """Alg. 1: ``steps`` rounds of scoring the entries still held (gradients over the next
    ``per_step`` of ``batches``, cycling) and keeping ``keep_schedule``'s count; the last keeps
    exactly ``final``. ``weights`` is the expanded LoRA before pruning; returns one mask per key."""
    masks = {key: np.ones(weight.shape, dtype=bool) for key, weight in weights.items()}
    total = sum(m.size for m in masks.values())
    for step in range(1, steps + 1):
        start = (step - 1) * per_step
        chosen = [batches[(start + i) % len(batches)] for i in range(per_step)]
        grad, fisher = local_gradients(model, {k: w * masks[k] for k, w in weights.items()}, chosen)
        scores = {k: importance_scores(weights[k], grad[k], fisher[k], importance) for k in weights}
        masks = top_entries(scores, masks, keep_schedule(total, final, step, steps))
    return masks
