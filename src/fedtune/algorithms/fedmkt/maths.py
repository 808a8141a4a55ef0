"""FedMKT's maths as pure functions: top-k knowledge, DualMinCE (Alg. 2) and the mixed loss.

Shapes: ``N`` positions (response tokens, row-major over a batch), ``V`` the student's vocabulary,
``k`` the number of teacher entries per position. Teacher rows are padded with id -1 and value -inf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedtune.train.loop import LossFn
from fedtune.train.losses import labelled_logits

NOT_SELECTED = -1


def dual_min_ce(client_losses: np.ndarray, local_loss: np.ndarray) -> np.ndarray:
    """Alg. 2 (DualMinCE): for each public sample the teacher k* = argmin_k l_k^i, kept only if its
    loss is below the learner's own (``l_k*^i < l_local^i``).

    ``client_losses``: [K, N] each teacher's per-sample loss; ``local_loss``: [N]. Returns [N] int64:
    k* (ties: the lowest k) or ``NOT_SELECTED``. With one teacher (K = 1) it is the clients' rule
    "keep i if the LLM's loss is below mine".
    """
    losses = np.asarray(client_losses, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] != len(local_loss):
        raise ValueError(f"client_losses must be [K, {len(local_loss)}], got {losses.shape}")
    best = np.argmin(losses, axis=0)
    best_loss = losses[best, np.arange(losses.shape[1])]
    return np.where(best_loss < np.asarray(local_loss, dtype=np.float64), best, NOT_SELECTED).astype(np.int64)


def soft_target_ce(student_logits: Tensor, teacher_ids: Tensor, teacher_values: Tensor) -> Tensor:
    """Per-row cross-entropy of the student against a sparse teacher: ``-sum_j p_t(j) log p_s(j)``.

    ``student_logits``: [N, V]; ``teacher_ids`` [N, k] (-1 = padding); ``teacher_values`` [N, k]
    teacher logits (-inf on padding): the teacher distribution is their softmax over the row's
    entries (a one-hot row has a single entry). Returns [N].
    """
    valid = teacher_ids >= 0
    if not bool(valid.any(dim=-1).all()):
        raise ValueError("soft_target_ce: a teacher row has no entry")
    if int(teacher_ids.max()) >= student_logits.shape[-1]:
        raise ValueError(
            f"teacher id {int(teacher_ids.max())} is outside the student's {student_logits.shape[-1]} logits"
        )
    values = teacher_values.float().masked_fill(~valid, float("-inf"))
    teacher = torch.softmax(values, dim=-1)
    log_student = F.log_softmax(student_logits.float(), dim=-1)
    picked = log_student.gather(-1, teacher_ids.clamp_min(0))
    return -(teacher * picked.masked_fill(~valid, 0.0)).sum(dim=-1)


def mixed_loss(
    student_logits: Tensor,
    targets: Tensor,
    teacher_ids: Tensor,
    teacher_values: Tensor,
    selected: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``lam * CE + (1 - lam) * KD`` summed over N positions (the loop divides by the token count).

    CE is the next-token cross-entropy on every position; KD (``soft_target_ce``) only on the
    ``selected`` [N] positions (those of samples DualMinCE kept). Returns (loss, ce, kd), all sums.
    """
    ce = F.cross_entropy(student_logits.float(), targets, reduction="sum")
    if bool(selected.any()):
        kd = soft_target_ce(student_logits[selected], teacher_ids[selected], teacher_values[selected]).sum()
    else:
        kd = ce.new_zeros(())
    return lam * ce + (1.0 - lam) * kd, ce.detach(), kd.detach()


def mixed_loss_fn(lam: float, stats: dict[str, float]) -> LossFn:
    """A ``train_local`` loss: ``mixed_loss`` on a KD batch (``kd_collate``); adds CE/KD sums to ``stats``."""

    def loss(model: torch.nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, int]:
        logits, targets = labelled_logits(model, batch)
        mask = batch["labels"][:, 1:] != -100
        ids = batch["teacher_ids"][:, 1:][mask]
        values = batch["teacher_values"][:, 1:][mask]
        selected = batch["selected"][:, None].expand_as(mask)[mask] & (ids[:, 0] >= 0)
        total, ce, kd = mixed_loss(logits, targets, ids, values, selected, lam)
        stats["ce"] = stats.get("ce", 0.0) + float(ce)
        stats["kd"] = stats.get("kd", 0.0) + float(kd)
        stats["kd_tokens"] = stats.get("kd_tokens", 0.0) + float(selected.sum())
        return total, int(targets.numel())

    return loss


@torch.no_grad()
def public_knowledge(
    model: torch.nn.Module, batches: Sequence[Mapping[str, Tensor]], top_k: int, vocab_size: int
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Per-sample loss and per-position top-k on the public set, batches in sample order.

    Returns ``losses`` [N] (mean CE over each sample's response tokens), and per sample ``ids`` and
    ``values`` [T_i, top_k]: the top-k logits of the distribution that predicts each response token,
    among the tokenizer's ``vocab_size`` ids (a model's padded embedding rows name no token).
    """
    device = next(model.parameters()).device
    losses: list[float] = []
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    model.eval()
    for batch in batches:
        batch = {key: value.to(device) for key, value in batch.items()}
        logits, targets = labelled_logits(model, batch)
        logits = logits.float()
        token_ce = F.cross_entropy(logits, targets, reduction="none")
        top_values, top_ids = logits[:, :vocab_size].topk(top_k, dim=-1)
        counts = (batch["labels"][:, 1:] != -100).sum(dim=1).tolist()
        start = 0
        for count in counts:
            if count == 0:
                raise ValueError("a public example has no response token left after truncation")
            losses.append(float(token_ce[start : start + count].mean()))
            ids.append(top_ids[start : start + count].cpu().numpy())
            values.append(top_values[start : start + count].cpu().numpy())
            start += count
    return np.asarray(losses, dtype=np.float32), ids, values
