"""FedBiOT on the wire: what travels and how it is keyed.

A client is sent the adapter A (``adapter/``), the layer layout it rebuilds its emulator model from
(``layout/``), the emulator E (``emulator/``) when it lacks the current version, and the frozen part
(``frozen/``: embeddings, final norm, head, in LoRA mode the adapter layers' base weights, plus the
architecture as ``arch``) on first contact; it replies with A. Layer weights are keyed by their
layer's *original* index in the full model, so a payload shows which layers leave the server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.fedbiot.emulator import emulator_parameters
from fedtune.config import LoraConfig
from fedtune.fl.broadcast import ARCH, sent_parts
from fedtune.fl.payload import Payload
from fedtune.models.lora import build_lora, lora_targets
from fedtune.models.surgery import (
    LayerSplit,
    ParamFilter,
    all_params,
    layer_parameters,
    layer_state,
    lora_params,
    lora_target_regex,
    non_layer_parameters,
    num_decoder_layers,
    unwrap,
)

FROZEN = "frozen/"
EMULATOR = "emulator/"
LAYOUT = "layout/"


def split_from_layout(msg: Payload) -> LayerSplit:
    def ints(key: str) -> tuple[int, ...]:
        return tuple(int(i) for i in np.asarray(msg[LAYOUT + key]).tolist())

    kept, bottom, emulator = ints("kept"), ints("adapter_bottom"), ints("emulator")
    top = tuple(i for i in kept if i not in set(bottom) | set(emulator))
    return LayerSplit(int(msg[LAYOUT + "num_layers"]), bottom, top, emulator, emulator)


def layout_payload(split: LayerSplit) -> Payload:
    return {
        LAYOUT + "num_layers": split.num_layers,
        LAYOUT + "kept": np.asarray(split.kept, dtype=np.int32),
        LAYOUT + "adapter_bottom": np.asarray(split.adapter_bottom, dtype=np.int32),
        LAYOUT + "emulator": np.asarray(split.emulator, dtype=np.int32),
    }


def with_adapter_lora(model: Any, split: LayerSplit, lora: LoraConfig, *, seed: int, emulator: bool) -> Any:
    """``model`` (the full model, or with ``emulator`` the emulator model) with the run's LoRA on the
    adapter layers only (``adapter_mode: lora``)."""
    positions = split.emulator_positions()
    layers = [positions[i] for i in split.adapter] if emulator else list(split.adapter)
    regex = lora_target_regex(model, layers, lora_targets(model, lora))
    return build_lora(model, lora, seed=seed, target_modules=regex)


def adapter_filter(mode: str) -> ParamFilter:
    return lora_params if mode == "lora" else all_params


def adapter_parameters(
    model: torch.nn.Module, split: LayerSplit, mode: str, *, emulator: bool
) -> dict[str, torch.nn.Parameter]:
    """A: what clients train and send up (whole layers, or their LoRA factors in ``lora`` mode)."""
    positions = split.emulator_positions() if emulator else None
    return layer_parameters(model, split.adapter, positions, adapter_filter(mode))


def adapter_state(full: torch.nn.Module, split: LayerSplit, mode: str) -> dict[str, np.ndarray]:
    """A of the full model as float32 arrays (the initial global adapter)."""
    return layer_state(full, split.adapter, None, adapter_filter(mode))


def frozen_parameters(model: torch.nn.Module, split: LayerSplit, mode: str) -> dict[str, torch.nn.Parameter]:
    """What never trains: embeddings, final norm, head, and in LoRA mode the adapter layers' base weights."""
    frozen = non_layer_parameters(model)
    if mode == "lora":
        positions = split.emulator_positions() if _is_emulator(model, split) else None
        frozen.update(layer_parameters(model, split.adapter, positions, lambda name: "lora_" not in name))
    return frozen


def _is_emulator(model: torch.nn.Module, split: LayerSplit) -> bool:
    return num_decoder_layers(model) == len(split.kept) != split.num_layers


def emulator_state(emulator: torch.nn.Module, split: LayerSplit) -> dict[str, np.ndarray]:
    """E's weights as float32 arrays keyed by original layer index (sent, saved, checkpointed)."""
    return layer_state(emulator, split.emulator, split.emulator_positions())


def part_parameters(
    model: torch.nn.Module, split: LayerSplit, part: str, mode: str
) -> dict[str, torch.nn.Parameter]:
    """The parameters a broadcast ``part`` ("frozen" or "emulator") fills in a client's model."""
    if part == "frozen":
        return frozen_parameters(model, split, mode)
    return emulator_parameters(model, split)


def part_payload(part: str, emulator: torch.nn.Module, split: LayerSplit, mode: str) -> Payload:
    """The frozen part (with the architecture) or the emulator as payload entries."""
    if part == "frozen":
        frozen = frozen_parameters(emulator, split, mode)
        entries: Payload = {FROZEN + k: p.detach().float().cpu().numpy() for k, p in frozen.items()}
        entries[ARCH] = unwrap(emulator).config.to_json_string(use_diff=False)
        return entries
    return {EMULATOR + k: v for k, v in emulator_state(emulator, split).items()}


def parameter_counts(
    full: torch.nn.Module, emulator: torch.nn.Module, split: LayerSplit, mode: str
) -> dict[str, int]:
    """Parameter counts: the full model, what a client holds (the emulator model), the adapter."""

    def count(params: Iterable[torch.nn.Parameter]) -> int:
        return sum(p.numel() for p in params)

    adapter = adapter_parameters(emulator, split, mode, emulator=True)
    return {
        "full_params": count(unwrap(full).parameters()),
        "client_params": count(unwrap(emulator).parameters()),
        "adapter_params": count(adapter.values()),
    }


def emulator_traffic(messages: Iterable[Payload], wire_dtype: str) -> tuple[int, int]:
    """How many of ``messages`` carry the emulator, and its bytes as sent (fp16 under ``fed.wire_dtype``
    fp16)."""
    return sent_parts(messages, (EMULATOR,), wire_dtype)
