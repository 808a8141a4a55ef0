"""Decoder layers of the supported families: where they sit, which to keep, a copy with only those.

A model's decoder layers are ``getattr(model.get_submodule(owner), attribute)`` for the
``(owner, attribute)`` of its ``config.model_type`` in `LAYER_PATHS`. `truncate_layers` keeps some of
them (the embeddings, final norm and head unchanged, so the vocabulary and tokenizer are too); it
serves the derived models (``fedtune models derive``), the offsite-tuning emulators
(`fedtune.models.surgery`) and FedPFT's sub-models.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import nn
from transformers import PreTrainedModel

# Where each supported family keeps its decoder layers (owner module, attribute).
LAYER_PATHS: dict[str, tuple[str, str]] = {
    "llama": ("model", "layers"),
    "mistral": ("model", "layers"),
    "qwen2": ("model", "layers"),
    "qwen3": ("model", "layers"),
    "gemma2": ("model", "layers"),
    "gemma3_text": ("model", "layers"),
    "gpt2": ("transformer", "h"),
    "bert": ("bert.encoder", "layer"),  # BertForSequenceClassification (FedOT on encoders)
}


def keep_layer_indices(num_layers: int, keep: int) -> list[int]:
    """``keep`` of ``num_layers`` layer indices at a uniform stride, first and last included.

    Index j is ``round(j * (num_layers - 1) / (keep - 1))``:
    (30, 10) -> [0, 3, 6, 10, 13, 16, 19, 23, 26, 29].
    """
    if num_layers < 1:
        raise ValueError(f"a model needs at least one layer, got num_layers={num_layers}")
    if not 1 <= keep <= num_layers:
        raise ValueError(f"can keep between 1 and {num_layers} of {num_layers} layers, not {keep}")
    if keep == 1:
        return [num_layers - 1]  # the layer that feeds the final norm and LM head
    return [round(j * (num_layers - 1) / (keep - 1)) for j in range(keep)]


def _layer_path(model: nn.Module) -> tuple[str, str]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in LAYER_PATHS:
        raise ValueError(
            f"cannot drop layers of a {model_type!r} model: supported families are {', '.join(LAYER_PATHS)}"
        )
    return LAYER_PATHS[model_type]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a supported causal LM (``model.model.layers``, GPT-2's ``transformer.h``)."""
    owner, attribute = _layer_path(model)
    layers = getattr(model.get_submodule(owner), attribute)
    assert isinstance(layers, nn.ModuleList)
    return layers


def truncate_layers(model: PreTrainedModel, indices: Sequence[int]) -> PreTrainedModel:
    """A deep copy of ``model`` keeping only the decoder layers at ``indices`` (increasing); ``model``
    itself is left as it was.

    The kept layers' attention modules are renumbered 0..k-1 (their ``layer_idx`` picks their slot
    in the KV cache, which is sized by ``num_hidden_layers``), and ``config.layer_types`` (per-layer
    sliding / full attention) is cut to the kept layers.
    """
    owner_name, attribute = _layer_path(model)
    layers = decoder_layers(model)
    if (
        not indices
        or list(indices) != sorted(set(indices))
        or not 0 <= indices[0] <= indices[-1] < len(layers)
    ):
        raise ValueError(
            f"layer indices must be increasing, distinct and in [0, {len(layers)}), got {indices}"
        )
    if getattr(model.config, "scale_attn_by_inverse_layer_idx", False):
        # The attention scale depends on the layer's position, so a moved layer would change its output.
        raise ValueError("cannot drop layers of a GPT-2 model with scale_attn_by_inverse_layer_idx")
    kept = set(indices)
    # Pre-filling the memo with the dropped layers keeps deepcopy from copying them only to drop them.
    memo: dict[int, Any] = {id(layer): layer for index, layer in enumerate(layers) if index not in kept}
    student = copy.deepcopy(model, memo)
    owner = student.get_submodule(owner_name)
    student_layers = nn.ModuleList([getattr(owner, attribute)[index] for index in indices])
    for new_index, layer in enumerate(student_layers):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                setattr(module, "layer_idx", new_index)  # noqa: B010  # nn.Module's attribute typing
    setattr(owner, attribute, student_layers)
    student.config.num_hidden_layers = len(indices)
    layer_types = getattr(student.config, "layer_types", None)
    if layer_types is not None:
        student.config.layer_types = [layer_types[index] for index in indices]
    return student
