"""Losses as small pure functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

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


# Families whose logits are exactly lm_head(final hidden state): no soft-capping, no logit scale.
PLAIN_HEAD_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gpt2"})
# Families whose logits are lm_head(final hidden state), then tanh soft-capping where the config's
# ``final_logit_softcapping`` is set (Gemma 2; Gemma 1 and Gemma 3 leave it unset).
CAPPED_HEAD_FAMILIES = frozenset({"gemma", "gemma2", "gemma3_text"})


def head_at_positions(model: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The map from the decoder's final hidden states to ``model``'s logits, when running it on
    chosen positions only gives the same logits as the full forward; None otherwise.

    ``model`` is the bare causal LM (unwrap a PEFT model first): ``model.get_decoder()`` then gives
    the hidden states that this map takes.
    """
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or family not in PLAIN_HEAD_FAMILIES | CAPPED_HEAD_FAMILIES:
        return None
    cap = getattr(config, "final_logit_softcapping", None) if family in CAPPED_HEAD_FAMILIES else None
    if not cap:
        return cast(Callable[[torch.Tensor], torch.Tensor], head)

    def capped(hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(head(hidden) / cap) * cap

    return capped


def labelled_logits(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits at the positions that predict a labelled token, and those tokens.

    Returns ``(logits [N, V], targets [N])`` for the ``N`` positions ``t`` with
    ``labels[t + 1] != -100``, in row-major order. The [B, T, V] logits (V = 49k for SmolLM2) are
    never built: the LM head runs only at those positions. Families without `head_at_positions`
    fall back to the full logits.
    """
    wrapped: Any = model
    base: Any = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
    head = head_at_positions(base)
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    if head is None:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return logits[:, :-1][mask], labels[mask]
    hidden = base.get_decoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state
    return head(hidden[:, :-1][mask]), labels[mask]


def response_nll(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Summed response-token NLL, applying the LM head only at labelled positions.

    Equal to ``causal_lm_nll(model(...).logits, labels)`` without building the full logits: with a
    fifth of the positions labelled, most of the head matmul, the full-vocabulary softmax and their
    backward buffers were wasted (bench/sft_throughput.py: 1.12x steps/s).
    """
    logits, targets = labelled_logits(model, batch)
    if targets.numel() == 0:
        return logits.sum() * 0.0, 0
    return F.cross_entropy(logits.float(), targets, reduction="sum"), int(targets.numel())


def summed_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Summed KL(p || q) over rows of ``[N, V]`` logits (temperature 1, the shared first V columns).

    ``F.kl_div(input, target)`` is KL(target || input): ``q`` goes in as the input, ``p`` as the
    target; gradients flow through both.
    """
    width = min(p_logits.shape[-1], q_logits.shape[-1])
    log_q = F.log_softmax(q_logits[..., :width].float(), dim=-1)
    log_p = F.log_softmax(p_logits[..., :width].float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="sum")


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Summed forward KL(p_teacher || p_student) over rows of ``[N, V]`` logits (temperature 1)."""
    return summed_kl(teacher_logits, student_logits)


def proximal_term(params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """||w - w_ref||^2 summed over the named parameters present in ``reference``."""
    terms = [((params[name] - ref.to(params[name].device)) ** 2).sum() for name, ref in reference.items()]
    if not terms:
        raise ValueError("proximal_term: no parameter of the reference is trainable")
    return torch.stack(terms).sum()


def normalised_hidden_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``||s - t||^2 / ||t||^2`` over rows of ``[N, H]`` hidden states: the squared error relative
    to the teacher's mean square, so the term is scale-free (hidden norms grow with depth)."""
    teacher = teacher.float()
    return ((student.float() - teacher) ** 2).sum() / (teacher**2).sum().clamp_min(1e-12)


def emulator_alignment_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    lam: float,
    *,
    kl_order: Literal["emulator_first", "full_first"],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FedBiOT's eq. (2) on N positions: normalised hidden MSE + lam * mean KL over positions.

    The student is the emulator with the adapter, M(x; A, E); the teacher the full model with it,
    M(x; A, E*). ``kl_order: emulator_first`` is eq. (2)'s KL(p_student || p_teacher);
    ``full_first`` the usual distillation order KL(p_teacher || p_student). Returns
    ``(loss, mse, kl)``.
    """
    mse = normalised_hidden_mse(student_hidden, teacher_hidden)
    rows = max(1, student_logits.shape[0])
    if lam <= 0:
        kl = mse.new_zeros(())
    elif kl_order == "emulator_first":
        kl = summed_kl(student_logits, teacher_logits) / rows
    else:
        kl = distillation_kl(student_logits, teacher_logits) / rows
    return mse + lam * kl, mse.detach(), kl.detach()
