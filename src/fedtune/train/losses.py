"""Losses as small pure functions."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F


def causal_lm_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL over positions whose label is not -100.

    logits: [B, T, V]; labels: [B, T] aligned with the inputs (shifted here). Returns (sum, count).
    """
    shift_logits = logits[:, :-1, :]
    shift_labels = labels[:, 1:]
    mask = shift_labels != -100
    count = int(mask.sum())
    if count == 0:
        return logits.sum() * 0.0, 0
    nll = F.cross_entropy(shift_logits[mask].float(), shift_labels[mask], reduction="sum")
    return nll, count


def proximal_term(params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """||w - w_ref||^2 summed over the named parameters present in ``reference``."""
    terms = [((params[name] - ref.to(params[name].device)) ** 2).sum() for name, ref in reference.items()]
    if not terms:
        raise ValueError("proximal_term: no parameter of the reference is trainable")
    return torch.stack(terms).sum()
