"""FedPT's distillation (eq. 5): the proxy teacher's parts, the loss, the optimiser and one student step.

Shapes: ``N`` labelled (response) positions of a batch, ``V`` the vocabulary the small and large
LMs share (``vocab_width``), ``V_s >= V`` the small LM's own, ``V_l >= V`` the large LM's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from fedtune.algorithms.fedpt.config import FedPTConfig
from fedtune.proxy.source import LogitSource
from fedtune.train.losses import distillation_kl, labelled_logits
from fedtune.train.optim import build_optimizer, build_scheduler

Batch = dict[str, Tensor]


def frozen_teacher(model: Any, large: LogitSource, batch: Batch, alpha: float, vocab_width: int) -> Tensor:
    """The part of the proxy teacher that never changes, ``C = z_l0 - alpha * z_s0`` ``[N, V]``, at the
    labelled positions of ``batch``: ``z_l0`` the large LM's logits, ``z_s0`` the small base LM's (its
    LoRA disabled; fp32, eval mode, no grad). ``alpha = 0`` needs no small-LM forward."""
    z_large = large.labelled_logits(batch)[:, :vocab_width]
    if alpha == 0.0:
        return z_large
    model.eval()
    with torch.inference_mode(), model.disable_adapter():
        z_base, _ = labelled_logits(model, batch)
    return z_large.to(z_base.device) - alpha * z_base[:, :vocab_width].float()


def proxy_teacher(frozen: Tensor, z_tuned: Tensor, alpha: float, vocab_width: int) -> Tensor:
    """The proxy-tuned large LM's logits ``C + alpha * z_sbar``, ``[N, V]``: ``frozen [N, V]`` is
    ``frozen_teacher``, ``z_tuned [N, V_s]`` the aggregated small LM's logits (``logits_with``)."""
    return frozen + alpha * z_tuned[:, :vocab_width]


def kd_loss(
    student: Tensor, targets: Tensor, teacher: Tensor, kd_lambda: float, vocab_width: int
) -> tuple[Tensor, float, float]:
    """Eq. 5 for one batch: ``((1 - lambda) * CE + lambda * KL(teacher || student)) / N``.

    ``student [N, V_s]`` logits (CE over the student's own vocabulary), ``targets [N]`` token ids,
    ``teacher [N, V]`` proxy logits over the shared ``vocab_width``. Returns the scalar loss and the
    mean CE and KL per token.
    """
    count = max(1, int(targets.numel()))
    ce = F.cross_entropy(student.float(), targets, reduction="sum")
    kl = distillation_kl(student[:, :vocab_width], teacher)
    loss = ((1.0 - kd_lambda) * ce + kd_lambda * kl) / count
    return loss, float(ce.detach()) / count, float(kl.detach()) / count


def logits_with(
    model: Any, trainable: Mapping[str, Tensor], weights: Mapping[str, Tensor], batch: Batch
) -> Tensor:
    """The small LM's labelled logits ``[N, V_s]`` (fp32) with ``weights`` swapped into its
    ``trainable`` tensors: eval mode (no LoRA dropout), no grad, the current weights restored after."""
    model.eval()
    with torch.no_grad():
        current = {n: p.detach().clone() for n, p in trainable.items()}
        for name, param in trainable.items():
            param.copy_(weights[name])
        try:
            logits, _ = labelled_logits(model, batch)
        finally:
            for name, param in trainable.items():
                param.copy_(current[name])
    return logits.float()


def kd_optimizer(
    params: Sequence[torch.nn.Parameter], section: FedPTConfig, rnd: int, rounds: int
) -> tuple[Optimizer, LambdaLR]:
    """The distillation's optimiser (``fedpt.kd_*``) over ``params`` and its schedule within round ``rnd``."""
    optimizer = build_optimizer(
        params,
        section.kd_optimizer,
        lr=section.kd_lr,
        weight_decay=section.kd_weight_decay,
        betas=section.kd_betas,
        momentum=section.kd_momentum,
    )
    scheduler = build_scheduler(
        optimizer,
        section.kd_schedule,
        steps_this_round=section.kd_steps,
        rnd=rnd,
        rounds=rounds,
        scope="round",
        warmup_ratio=section.kd_warmup_ratio,
        min_ratio=section.kd_min_lr_ratio,
    )
    return optimizer, scheduler


def kd_step(
    model: Any,
    batch: Batch,
    teacher: Tensor,
    optimizer: Optimizer,
    params: Sequence[torch.nn.Parameter],
    *,
    kd_lambda: float,
    clip_norm: float | None,
) -> tuple[float, float, float]:
    """One optimiser step of eq. 5 on ``batch`` towards ``teacher [N, V]`` (train mode, gradients of
    ``params`` clipped at ``clip_norm`` if set). Returns the loss and the mean CE and KL per token."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    student, targets = labelled_logits(model, batch)
    loss, ce, kl = kd_loss(student, targets, teacher, kd_lambda, teacher.shape[-1])
    loss.backward()
    if clip_norm:
        torch.nn.utils.clip_grad_norm_(list(params), clip_norm)
    optimizer.step()
    return loss.item(), ce, kl
