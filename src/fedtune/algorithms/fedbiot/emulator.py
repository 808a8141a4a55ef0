"""FedBiOT's emulator: the layer split that makes it, and its alignment to the full model (eq. 2) on
the server's public batches.

Shapes: ``B`` batch, ``T`` tokens, ``P`` the non-pad positions of a batch, ``H`` hidden size, ``V``
vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.data.records import Record
from fedtune.data.templates import TemplateName
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.decode.generate import model_device
from fedtune.models.surgery import (
    LayerSplit,
    layer_extract,
    layer_parameters,
    offsite_split,
    set_trainable,
    unwrap,
)
from fedtune.train.losses import emulator_alignment_loss, head_at_positions
from fedtune.train.optim import build_optimizer

Batch = dict[str, Tensor]


def make_split(section: FedBiOTConfig, num_layers: int) -> LayerSplit:
    """LayerExtract (``split: last``) or Offsite-tuning's split (``first_last``) of ``num_layers``."""
    if section.split == "last":
        return layer_extract(num_layers, section.adapter_layers, section.dropout)
    half = section.adapter_layers // 2
    return offsite_split(num_layers, section.dropout, bottom=half, top=half)


def public_batches(
    records: Sequence[Record],
    tokenizer: Any,
    *,
    template: TemplateName,
    max_length: int,
    batch_size: int,
    count: int | None,
    seed: int,
) -> list[Batch]:
    """``count`` of ``records`` (a seeded sample; all when fewer) tokenized and batched, in a seeded
    order: ``input_ids``/``attention_mask`` [B, T] per batch."""
    if count is not None and len(records) > count:
        rng = np.random.default_rng([seed, 0xB1])
        records = [records[i] for i in sorted(rng.choice(len(records), count, replace=False))]
    examples = encode_records(records, tokenizer, template, max_length)
    return make_batches(examples, batch_size, int(tokenizer.pad_token_id or 0), seed=seed, bucketing=False)


def hidden_and_logits(model: torch.nn.Module, batch: Batch, hidden_index: int) -> tuple[Tensor, Tensor]:
    """Hidden states ``hidden_index`` [P, H] and next-token logits [P, V] at the non-pad positions of
    ``batch`` (``input_ids``/``attention_mask`` [B, T]).

    ``hidden_states[k]`` is the input of decoder layer k (0: the embeddings), so the output of layer
    i is index i + 1 for i < n - 1; the last index n is the last layer's output after the final norm,
    which no split reads (E* always ends below the top adapter). For plain-head families the LM head
    runs on the non-pad positions only.
    """
    causal: Any = unwrap(model)
    device = model_device(causal)  # the batches are built on the CPU; the models may sit on a GPU
    mask = batch["attention_mask"].to(device).bool()
    inputs = {
        "input_ids": batch["input_ids"].to(device),
        "attention_mask": batch["attention_mask"].to(device),
        "use_cache": False,
        "output_hidden_states": True,
    }
    head = head_at_positions(causal)
    if head is not None:
        out = causal.get_decoder()(**inputs)
        return out.hidden_states[hidden_index][mask], head(out.last_hidden_state[mask])
    out = causal(**inputs)
    return out.hidden_states[hidden_index][mask], out.logits[mask]


def next_token_ce(logits: Tensor, batch: Batch) -> Tensor:
    """The mean cross-entropy of ``logits`` [P, V] (at the P non-pad positions of ``batch``, in row-major
    order, as `hidden_and_logits` gives them) against each position's next token; positions whose next
    token is padding or past the end do not count."""
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    following = torch.full_like(ids, -100)
    following[:, :-1] = torch.where(mask[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    targets = following[mask].to(logits.device)
    if not bool((targets != -100).any()):
        return logits.new_zeros((), dtype=torch.float32)
    return torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)


def emulator_parameters(emulator: torch.nn.Module, split: LayerSplit) -> dict[str, torch.nn.Parameter]:
    """E's parameters: what the server's alignment trains."""
    return layer_parameters(emulator, split.emulator, split.emulator_positions())


def alignment_optimizer(
    emulator: torch.nn.Module, split: LayerSplit, kind: str, lr: float
) -> torch.optim.Optimizer:
    """A new optimizer (``sgd`` or ``adamw``) over E's parameters; the emulator is left frozen."""
    params = emulator_parameters(emulator, split)
    set_trainable(emulator, params)  # the optimizer takes only parameters that require grad
    optimizer = build_optimizer(params.values(), kind, lr=lr)
    set_trainable(emulator, {})
    return optimizer


@dataclass
class AlignStats:
    """Means over an alignment's steps: the loss of eq. (2), its normalised MSE and KL terms."""

    loss: float
    mse: float
    kl: float
    steps: int


def align_emulator(
    full: torch.nn.Module,
    emulator: torch.nn.Module,
    split: LayerSplit,
    batches: Sequence[Batch],
    *,
    lam: float,
    kl_order: Literal["emulator_first", "full_first"],
    optimizer: torch.optim.Optimizer,
    clip_norm: float | None = 1.0,
    lm_weight: float = 0.0,
) -> AlignStats:
    """One step of eq. (2) per batch (``input_ids``/``attention_mask`` [B, T]): only E's parameters
    (``emulator_parameters``) train; the loss compares E's and E*'s hidden states [P, H] and the
    models' next-token distributions [P, V] at the P non-pad positions.

    Student and teacher both run without dropout (eval mode), so the distillation target and the
    student see the same deterministic functions; ``optimizer`` holds E's parameters and keeps its
    state from call to call. ``lm_weight`` > 0 adds that times the emulator model's mean next-token
    cross-entropy on the batch (Offsite-tuning's LM term).
    """
    if not batches:
        return AlignStats(0.0, 0.0, 0.0, 0)
    params = emulator_parameters(emulator, split)
    set_trainable(emulator, params)
    emulator.eval()
    totals = np.zeros(3)
    for batch in batches:
        with torch.no_grad():
            teacher_hidden, teacher_logits = hidden_and_logits(full, batch, split.teacher_hidden_index)
        student_hidden, student_logits = hidden_and_logits(emulator, batch, split.student_hidden_index)
        loss, mse, kl = emulator_alignment_loss(
            student_hidden, teacher_hidden, student_logits, teacher_logits, lam, kl_order=kl_order
        )
        if lm_weight > 0:
            loss = loss + lm_weight * next_token_ce(student_logits, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip_norm)
        optimizer.step()
        totals += [float(loss.detach()), float(mse), float(kl)]
    emulator.eval()
    set_trainable(emulator, {})
    mean = totals / len(batches)
    return AlignStats(float(mean[0]), float(mean[1]), float(mean[2]), len(batches))
