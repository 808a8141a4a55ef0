"""Optimizers and learning-rate schedules, built from plain arguments."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from fedtune.fl.payload import tensor_to_array


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    name: str,
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    momentum: float = 0.0,
) -> Optimizer:
    """AdamW, SGD or Prodigy (``prodigyopt``; the FedPT paper uses it with lr = 1.0)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters")
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "prodigy":
        from prodigyopt import Prodigy

        optimizer: Optimizer = Prodigy(params, lr=lr, betas=betas, weight_decay=weight_decay)
        return optimizer
    raise ValueError(f"unknown optimizer {name!r}; choose adamw, sgd or prodigy")


def schedule_factor(
    schedule: str, step: int, total: int, *, warmup: int = 0, min_ratio: float = 0.0
) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based) of ``total``.

    Linear warmup over ``warmup`` steps, then constant / cosine / linear decay to ``min_ratio``.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"unknown schedule {schedule!r}; choose constant, cosine or linear")
    return min_ratio + (1.0 - min_ratio) * decay


def build_scheduler(
    optimizer: Optimizer,
    schedule: str,
    *,
    steps_this_round: int,
    rnd: int,
    rounds: int,
    scope: str,
    warmup_ratio: float = 0.0,
    min_ratio: float = 0.0,
) -> LambdaLR:
    """Per-round scope restarts the schedule every round; global scope spans all rounds."""
    if scope == "global":
        offset, total = (rnd - 1) * steps_this_round, rounds * steps_this_round
    elif scope == "round":
        offset, total = 0, steps_this_round
    else:
        raise ValueError(f"unknown schedule scope {scope!r}; choose round or global")
    warmup = int(warmup_ratio * total)
    factor: Callable[[int], float] = lambda step: schedule_factor(  # noqa: E731
        schedule, offset + step, total, warmup=warmup, min_ratio=min_ratio
    )
    return LambdaLR(optimizer, factor)


def optimizer_state_to_tree(optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with string keys and numpy arrays, so a checkpoint can hold it. A bf16
    state (the optimizer of a bf16 model) is widened to fp32, exactly; ``load_state_dict`` casts it back to
    its parameter's dtype."""
    state = optimizer.state_dict()
    return {
        "state": {
            str(index): {k: tensor_to_array(v) if torch.is_tensor(v) else v for k, v in entry.items()}
            for index, entry in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def optimizer_state_from_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of ``optimizer_state_to_tree``: what ``optimizer.load_state_dict`` takes."""
    return {
        "state": {
            int(index): {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in entry.items()}
            for index, entry in tree["state"].items()
        },
        "param_groups": [dict(group) for group in tree["param_groups"]],
    }
