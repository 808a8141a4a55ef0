"""FedPFT's models and their parts: what trains, what is frozen, what travels, keyed the same everywhere.

Every state is keyed by the full model's parameter names (peft wrapper removed) with *original*
layer indices, so the LoRA + head a client trains on a sub-model (same layers, fewer FFN neurons) or
on a layer-dropped emulator plug into the full model by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from torch import nn

from fedtune.models.ffn import ffn_parameters as ffn_module_parameters
from fedtune.models.lora import attach_lora
from fedtune.models.surgery import layer_index, layer_pattern, relabel, unwrap

HEAD_PREFIXES = ("classifier.", "score.")
"""BERT's and the decoders' sequence-classification heads (transformers' names)."""
ATTENTION_TARGETS = {
    "bert": ["query", "key", "value", "attention.output.dense"],
    "roberta": ["query", "key", "value", "attention.output.dense"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma3_text": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


@dataclass(frozen=True)
class Layout:
    """Which original layers the client model holds, each held layer's FFN width, the positions of
    the layers whose FFN is narrower than the full model's (the ones the distillations train), and
    the original layers whose attention LoRA trains (None: every held layer; FedOT: its adapter)."""

    num_layers: int
    layers: tuple[int, ...]
    widths: tuple[int, ...]
    compressed: tuple[int, ...] = ()
    tuned: tuple[int, ...] | None = None

    def positions(self) -> dict[int, int]:
        """Original layer index -> position in the client model."""
        return {layer: position for position, layer in enumerate(self.layers)}


def attention_targets(model: nn.Module) -> list[str]:
    model_type = unwrap(model).config.model_type
    if model_type not in ATTENTION_TARGETS:
        raise ValueError(f"fedpft: no attention projections known for model type {model_type!r}")
    return ATTENTION_TARGETS[model_type]


def with_lora(model: nn.Module, r: int, alpha: int, dropout: float, seed: int) -> nn.Module:
    """LoRA on the attention projections (q, k, v, o) of every layer; the head is trained directly."""
    return attach_lora(
        model,  # type: ignore[arg-type]
        r=r,
        alpha=alpha,
        dropout=dropout,
        target_modules=attention_targets(model),
        seed=seed,
        task_type=None,
    )


def _original_names(model: nn.Module, layout: Layout | None) -> dict[str, nn.Parameter]:
    """Every parameter of ``model`` (peft wrapper removed) keyed with original layer indices."""
    base = unwrap(model)
    if layout is None:
        return dict(base.named_parameters())
    pattern = layer_pattern(base)
    original = dict(enumerate(layout.layers))
    return {relabel(name, pattern, original): p for name, p in base.named_parameters()}


def tuned_parameters(model: nn.Module, layout: Layout | None = None) -> dict[str, nn.Parameter]:
    """What clients train: attention LoRA (of ``layout.tuned``'s layers when set) and the task head."""
    names = _original_names(model, layout)
    if layout is None or layout.tuned is None:
        return {n: p for n, p in names.items() if "lora_" in n or n.startswith(HEAD_PREFIXES)}
    pattern, tuned = layer_pattern(unwrap(model)), set(layout.tuned)
    return {
        n: p
        for n, p in names.items()
        if n.startswith(HEAD_PREFIXES) or ("lora_" in n and layer_index(n, pattern) in tuned)
    }


def ffn_parameters(
    model: nn.Module, layout: Layout | None = None, positions: Iterable[int] | None = None
) -> dict[str, nn.Parameter]:
    """The FFN weights and biases (of the layers at ``positions`` in ``model``, default all)."""
    wanted = set(ffn_module_parameters(unwrap(model), positions))
    base_names = {id(p): n for n, p in unwrap(model).named_parameters()}
    return {k: p for k, p in _original_names(model, layout).items() if base_names[id(p)] in wanted}


def distilled_parameters(model: nn.Module, layout: Layout) -> dict[str, nn.Parameter]:
    """The compressed layers' FFNs: what the distillations change (re-sent after each)."""
    return ffn_parameters(model, layout, layout.compressed)


def frozen_parameters(model: nn.Module, layout: Layout) -> dict[str, nn.Parameter]:
    """Everything else but the tuned LoRA and the head: embeddings, attention, norms, pooler, whole
    FFNs, the LoRA of layers that do not train (FedOT's emulator; sent once)."""
    moving = set(tuned_parameters(model, layout)) | set(distilled_parameters(model, layout))
    return {k: p for k, p in _original_names(model, layout).items() if k not in moving}


def arrays_of(params: Mapping[str, nn.Parameter]) -> dict[str, np.ndarray]:
    return {k: p.detach().float().cpu().numpy().copy() for k, p in params.items()}


def count(params: Mapping[str, nn.Parameter] | Sequence[nn.Parameter]) -> int:
    values = params.values() if isinstance(params, Mapping) else params
    return int(sum(p.numel() for p in values))


def model_params(model: nn.Module) -> int:
    return count(list({id(p): p for p in unwrap(model).parameters()}.values()))
