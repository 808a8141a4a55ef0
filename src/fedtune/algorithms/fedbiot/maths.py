"""FedBiOT's maths: the layer split, the parameter groups, and the emulator alignment of eq. (2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.models.surgery import (
    LayerSplit,
    ParamFilter,
    all_params,
    layer_extract,
    layer_parameters,
    lora_params,
    non_layer_parameters,
    num_decoder_layers,
    offsite_split,
    set_trainable,
    unwrap,
)
from fedtune.train.losses import emulator_alignment_loss, head_at_positions

Batch = dict[str, Tensor]


def make_split(section: FedBiOTConfig, num_layers: int) -> LayerSplit:
    if section.split == "last":
        return layer_extract(num_layers, section.adapter_layers, section.dropout)
    half = section.adapter_layers // 2
    return offsite_split(num_layers, section.dropout, bottom=half, top=half)


def adapter_filter(mode: str) -> ParamFilter:
    return lora_params if mode == "lora" else all_params


def frozen_parameters(model: torch.nn.Module, split: LayerSplit, mode: str) -> dict[str, torch.nn.Parameter]:
    """What never trains: embeddings, final norm, head, and in LoRA mode the adapter layers' base weights."""
    frozen = non_layer_parameters(model)
    if mode == "lora":
        positions = split.emulator_positions() if _is_emulator(model, split) else None
        frozen.update(layer_parameters(model, split.adapter, positions, lambda name: "lora_" not in name))
    return frozen


def _is_emulator(model: torch.nn.Module, split: LayerSplit) -> bool:
    return num_decoder_layers(model) == len(split.kept) != split.num_layers


def hidden_and_logits(model: torch.nn.Module, batch: Batch, hidden_index: int) -> tuple[Tensor, Tensor]:
    """Hidden states ``hidden_index`` and next-token logits at the non-pad positions of ``batch``.

    ``hidden_states[k]`` is the input of decoder layer k (0: the embeddings), so the output of layer
    i is index i + 1. For plain-head families the LM head runs on the non-pad positions only.
    """
    causal: Any = unwrap(model)
    mask = batch["attention_mask"].bool()
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "use_cache": False,
        "output_hidden_states": True,
    }
    head = head_at_positions(causal)
    if head is not None:
        out = causal.get_decoder()(**inputs)
        return out.hidden_states[hidden_index][mask], head(out.last_hidden_state[mask])
    out = causal(**inputs)
    return out.hidden_states[hidden_index][mask], out.logits[mask]


def emulator_parameters(emulator: torch.nn.Module, split: LayerSplit) -> dict[str, torch.nn.Parameter]:
    """E's parameters: what the server's alignment trains."""
    return layer_parameters(emulator, split.emulator, split.emulator_positions())


@dataclass
class AlignStats:
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
    optimizer: torch.optim.Optimizer,
    clip_norm: float | None = 1.0,
) -> AlignStats:
    """One step of eq. (2) per batch: only E's parameters (``emulator_parameters``) train.

    Student and teacher both run without dropout (eval mode), so the distillation target and the
    student see the same deterministic functions; ``optimizer`` holds E's parameters and keeps its
    state from call to call.
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
            student_hidden, teacher_hidden, student_logits, teacher_logits, lam
        )
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
