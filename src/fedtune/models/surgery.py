"""Model surgery for offsite tuning: split a decoder into adapter + emulator, plug adapters back in.

FedBiOT's LayerExtract (its Algorithm 2) for ``n`` decoder layers, adapter size ``s`` and layer
dropout ``d``: the adapter A is the last ``s`` layers; the non-compressed emulator E* is layers
``0 .. n-s-1``; the emulator E keeps ``n' = floor((1 - d) (n - s))`` of E*'s layers at indices
``floor(j (n - s - 1) / (n' - 1))``, ``j = 0 .. n'-1`` (n = 32, s = 2, d = 0.2 -> 24 layers).
Offsite-tuning's split (Xiao et al.; FedOT) uses the first 2 and the last 2 layers as the adapter and
applies the same uniform drop to the block between them.

A split is described by a `LayerSplit` of *original* layer indices. The emulator model (what a client
holds) is the full model's embeddings, final norm and head around the kept layers
``bottom adapter + E + top adapter`` (`build_emulator`, a deep copy with attention ``layer_idx``
renumbered so KV caching works). Weights of layers move between the full model, the emulator model
and the wire keyed by their original index (`layer_state`, `load_layer_state`), so "layer 17" means the
same layer everywhere; plugging the adapter into the full model gives AdapFu, into the emulator model
AdapEmu. Works for every family of `fedtune.models.layers.LAYER_PATHS` (Llama, Qwen2, Mistral, Qwen3,
GPT-2), peft-wrapped or not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from fedtune.models.layers import LAYER_PATHS, truncate_layers


class SplitError(ValueError):
    """A split that cannot be made (too few layers, bad adapter size or dropout)."""


@dataclass(frozen=True)
class LayerSplit:
    """Original layer indices of each part; ``emulator`` is a subset of ``emulator_full``."""

    num_layers: int
    adapter_bottom: tuple[int, ...]
    adapter_top: tuple[int, ...]
    emulator_full: tuple[int, ...]
    emulator: tuple[int, ...]

    @property
    def adapter(self) -> tuple[int, ...]:
        return self.adapter_bottom + self.adapter_top

    @property
    def kept(self) -> tuple[int, ...]:
        """The layers of the emulator model, in order: bottom adapter, emulator, top adapter."""
        return self.adapter_bottom + self.emulator + self.adapter_top

    @property
    def dropped(self) -> tuple[int, ...]:
        """E* layers that are not in E: their weights never leave the server."""
        return tuple(i for i in self.emulator_full if i not in set(self.emulator))

    def emulator_positions(self) -> dict[int, int]:
        """Original index -> position in the emulator model."""
        return {original: position for position, original in enumerate(self.kept)}

    @property
    def teacher_hidden_index(self) -> int:
        """Index into the full model's ``hidden_states`` of E*'s output (= the top adapter's input)."""
        return self.emulator_full[-1] + 1

    @property
    def student_hidden_index(self) -> int:
        """Index into the emulator model's ``hidden_states`` of E's output."""
        return len(self.adapter_bottom) + len(self.emulator)

    def describe(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "adapter": list(self.adapter),
            "emulator_full": [self.emulator_full[0], self.emulator_full[-1]],
            "emulator": list(self.emulator),
            "dropped": list(self.dropped),
        }


def compressed_size(block: int, dropout: float) -> int:
    """``floor((1 - d) * block)`` without float noise (0.8 * 30 is 24, not 23.999...)."""
    return math.floor(round((1.0 - dropout) * block, 9))


def uniform_drop(block: Sequence[int], dropout: float) -> tuple[int, ...]:
    """LayerExtract's uniform layer dropout of ``block``: ``block[floor(j (m - 1) / (m' - 1))]``."""
    m = len(block)
    if m == 0:
        raise SplitError("nothing to compress: the emulator block has no layers")
    if not 0.0 <= dropout < 1.0:
        raise SplitError(f"dropout must be in [0, 1), got {dropout}")
    keep = compressed_size(m, dropout)
    if keep < 1:
        raise SplitError(f"dropout {dropout} leaves no layer of a {m}-layer emulator block")
    if keep == 1:
        return (block[0],)
    # Integer arithmetic: the paper's stride (m - 1) / (m' - 1) times j, floored, exactly.
    return tuple(block[(j * (m - 1)) // (keep - 1)] for j in range(keep))


def layer_extract(num_layers: int, adapter_layers: int, dropout: float) -> LayerSplit:
    """FedBiOT's split: adapter = the last ``adapter_layers`` layers, E* = the rest, E = uniform drop."""
    if not 1 <= adapter_layers < num_layers:
        raise SplitError(
            f"adapter size must be between 1 and {num_layers - 1} for a {num_layers}-layer model, "
            f"got {adapter_layers}"
        )
    full = tuple(range(num_layers - adapter_layers))
    return LayerSplit(
        num_layers=num_layers,
        adapter_bottom=(),
        adapter_top=tuple(range(num_layers - adapter_layers, num_layers)),
        emulator_full=full,
        emulator=uniform_drop(full, dropout),
    )


def offsite_split(num_layers: int, dropout: float, bottom: int = 2, top: int = 2) -> LayerSplit:
    """Offsite-tuning's split: adapter = the first ``bottom`` and last ``top`` layers."""
    if bottom < 0 or top < 1 or bottom + top >= num_layers:
        raise SplitError(
            f"an offsite split of {bottom} bottom + {top} top adapter layers needs more than "
            f"{bottom + top} layers, the model has {num_layers}"
        )
    full = tuple(range(bottom, num_layers - top))
    return LayerSplit(
        num_layers=num_layers,
        adapter_bottom=tuple(range(bottom)),
        adapter_top=tuple(range(num_layers - top, num_layers)),
        emulator_full=full,
        emulator=uniform_drop(full, dropout),
    )


def num_decoder_layers(model: nn.Module) -> int:
    config = unwrap(model).config
    return int(getattr(config, "num_hidden_layers", None) or config.n_layer)


def unwrap(model: nn.Module) -> Any:
    """The transformers model inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def build_emulator(model: PreTrainedModel, split: LayerSplit) -> PreTrainedModel:
    """The emulator model: embeddings, norm and head of ``model`` around ``split.kept`` (a deep copy)."""
    if num_decoder_layers(model) != split.num_layers:
        raise SplitError(
            f"the split is for {split.num_layers} layers, the model has {num_decoder_layers(model)}"
        )
    return truncate_layers(model, list(split.kept))


def _layer_regex(model: nn.Module) -> re.Pattern[str]:
    model_type = unwrap(model).config.model_type
    if model_type not in LAYER_PATHS:
        raise SplitError(f"no decoder-layer layout known for model type {model_type!r}")
    owner, attribute = LAYER_PATHS[model_type]
    return re.compile(rf"(?:^|\.)({re.escape(owner)}\.{re.escape(attribute)}\.)(\d+)\.")


def layer_pattern(model: nn.Module) -> re.Pattern[str]:
    """The regex whose group 2 is the layer index in ``model``'s parameter names."""
    return _layer_regex(model)


def layer_index(name: str, pattern: re.Pattern[str]) -> int | None:
    match = pattern.search(name)
    return int(match.group(2)) if match else None


def relabel(name: str, pattern: re.Pattern[str], mapping: Mapping[int, int]) -> str:
    """``name`` with its decoder-layer index ``i`` replaced by ``mapping[i]``."""
    match = pattern.search(name)
    if match is None:
        return name
    start, end = match.span(2)
    return name[:start] + str(mapping[int(match.group(2))]) + name[end:]


ParamFilter = Callable[[str], bool]


def all_params(name: str) -> bool:
    return True


def lora_params(name: str) -> bool:
    return "lora_" in name


def layer_parameters(
    model: nn.Module,
    originals: Sequence[int],
    positions: Mapping[int, int] | None = None,
    keep: ParamFilter = all_params,
) -> dict[str, nn.Parameter]:
    """Parameters of the layers at original indices ``originals``, keyed with original indices.

    ``positions`` maps an original index to the layer's position in ``model`` (identity for the full
    model; `LayerSplit.emulator_positions` for the emulator model).
    """
    pattern = _layer_regex(model)
    position_of = dict(positions) if positions is not None else {i: i for i in originals}
    original_of = {position_of[i]: i for i in originals}
    selected: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():
        position = layer_index(name, pattern)
        if position is None or position not in original_of or not keep(name):
            continue
        selected[relabel(name, pattern, original_of)] = param
    return selected


def non_layer_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Embeddings, final norm, head: every parameter outside the decoder layers (tied ones once)."""
    pattern = _layer_regex(model)
    return {name: p for name, p in model.named_parameters() if layer_index(name, pattern) is None}


def layer_state(
    model: nn.Module,
    originals: Sequence[int],
    positions: Mapping[int, int] | None = None,
    keep: ParamFilter = all_params,
) -> dict[str, np.ndarray]:
    """`layer_parameters` as float32 numpy copies (payload-ready)."""
    return {
        name: p.detach().float().cpu().numpy().copy()
        for name, p in layer_parameters(model, originals, positions, keep).items()
    }


def load_parameters(targets: Mapping[str, nn.Parameter], state: Mapping[str, Any], what: str) -> None:
    """Copy ``state`` into ``targets``: the same keys, the same shapes, or a clear error."""
    missing = sorted(set(targets) - set(state))
    extra = sorted(set(state) - set(targets))
    if missing or extra:
        detail = f"missing e.g. {missing[0]}" if missing else f"unexpected e.g. {extra[0]}"
        raise KeyError(f"{what}: {len(missing)} keys missing, {len(extra)} unexpected ({detail})")
    with torch.no_grad():
        for key, target in targets.items():
            value = state[key]
            tensor = torch.from_numpy(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"{what}: key {key} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor.to(dtype=target.dtype, device=target.device))


def load_layer_state(
    model: nn.Module,
    state: Mapping[str, Any],
    originals: Sequence[int],
    positions: Mapping[int, int] | None = None,
    keep: ParamFilter = all_params,
    what: str = "layer state",
) -> None:
    """Put ``state`` (keyed by original indices) into the layers ``originals`` of ``model``."""
    load_parameters(layer_parameters(model, originals, positions, keep), state, what)


def set_trainable(model: nn.Module, params: Mapping[str, nn.Parameter]) -> None:
    """Exactly ``params`` train; everything else in ``model`` is frozen."""
    chosen = {id(p) for p in params.values()}
    for p in model.parameters():
        p.requires_grad_(id(p) in chosen)


def lora_target_regex(model: nn.Module, positions: Sequence[int], modules: Sequence[str]) -> str:
    """A peft ``target_modules`` regex: the ``modules`` projections of the layers at ``positions`` only."""
    model_type = unwrap(model).config.model_type
    owner, attribute = LAYER_PATHS[model_type]
    layers = "|".join(str(p) for p in positions)
    names = "|".join(re.escape(m) for m in modules)
    return rf"(?:.*\.)?{re.escape(owner)}\.{re.escape(attribute)}\.({layers})\.(?:.*\.)?({names})"
