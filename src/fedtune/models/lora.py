"""LoRA attach and adapter state get/set, through peft's public API only."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from transformers import PreTrainedModel

from fedtune.config import LoraConfig as LoraSection

# Attention projections per model family: the papers put LoRA on q and v.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "gemma3_text": ["q_proj", "v_proj"],
    "gemma3": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "bert": ["query", "value"],
}


def default_targets(model: PreTrainedModel) -> list[str]:
    model_type = getattr(model.config, "model_type", "")
    if model_type not in DEFAULT_TARGETS:
        raise ValueError(
            f"no default LoRA targets for model type {model_type!r}; set lora.target_modules explicitly"
        )
    return DEFAULT_TARGETS[model_type]


def attach_lora(
    model: PreTrainedModel,
    *,
    r: int,
    alpha: int,
    dropout: float,
    target_modules: Sequence[str] | str | None = None,
    seed: int = 0,
    task_type: str | None = "CAUSAL_LM",
) -> PeftModel:
    """Wrap ``model`` with a freshly (seeded) initialised LoRA adapter; base weights are frozen.

    ``task_type`` None: a plain ``PeftModel`` that passes every call through (a sequence classifier whose
    head the caller trains itself, without peft's ``modules_to_save`` copies).
    """
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        # A string is a regex peft matches against the full module name.
        target_modules=target_modules
        if isinstance(target_modules, str)
        else list(target_modules or default_targets(model)),
        task_type=task_type,
        # GPT-2 stores its projections as Conv1D (weight transposed).
        fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2",
    )
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def lora_targets(
    model: PreTrainedModel,
    lora: LoraSection,
    defaults: Callable[[PreTrainedModel], list[str]] = default_targets,
) -> list[str]:
    """The module names LoRA goes on: ``lora.target_modules``, or a method's ``defaults`` when "auto"."""
    return defaults(model) if lora.target_modules == "auto" else list(lora.target_modules)


def build_lora(
    model: PreTrainedModel,
    lora: LoraSection,
    *,
    seed: int,
    rank: int | None = None,
    alpha: int | None = None,
    target_modules: Sequence[str] | str | None = None,
    task_type: str | None = "CAUSAL_LM",
) -> PeftModel:
    """The one way a method puts LoRA on a model: the run's ``lora:`` section (rank, alpha, dropout,
    targets), with a method's own ``rank`` and ``alpha`` (e.g. an expanded rank at scaling 1) or resolved
    ``target_modules`` (e.g. a regex over some layers only) where it needs one."""
    return attach_lora(
        model,
        r=lora.r if rank is None else rank,
        alpha=lora.alpha if alpha is None else alpha,
        dropout=lora.dropout,
        target_modules=target_modules if target_modules is not None else lora_targets(model, lora),
        seed=seed,
        task_type=task_type,
    )


_PARAMETERS_ATTR = "_fedtune_adapter_parameters"


def adapter_parameters(model: PeftModel) -> dict[str, torch.nn.Parameter]:
    """peft's adapter state-dict keys mapped to the model's own LoRA parameters, found once.

    ``get_peft_model_state_dict`` walks and filters the whole model state dict on every call
    (~20 ms on SmolLM2, bench/simulation_overhead.py); its tensors share storage with the
    parameters, so one walk gives the key -> parameter map and later swaps copy straight into them.
    """
    cached: dict[str, torch.nn.Parameter] | None = getattr(model, _PARAMETERS_ATTR, None)
    if cached is not None:
        return cached
    by_pointer = {p.data_ptr(): p for p in model.parameters()}
    mapping = {}
    for key, tensor in get_peft_model_state_dict(model).items():
        if tensor.data_ptr() not in by_pointer:
            raise RuntimeError(f"adapter key {key} is not a parameter of the model")
        mapping[key] = by_pointer[tensor.data_ptr()]
    setattr(model, _PARAMETERS_ATTR, mapping)
    return mapping


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors (detached copies), keyed as peft names them."""
    return {key: p.detach().clone() for key, p in adapter_parameters(model).items()}


def adapter_arrays(model: PeftModel) -> dict[str, np.ndarray]:
    """Adapter state as float32 numpy arrays, ready for a payload."""
    return {key: p.detach().float().cpu().numpy().copy() for key, p in adapter_parameters(model).items()}


def merge_lora(model: PeftModel) -> PreTrainedModel:
    """The base model with the LoRA folded into its weights (peft's ``merge_and_unload``).

    A bitsandbytes-quantised base (``model.quantization``) is refused: peft would dequantise each
    weight, add the LoRA product and quantise the sum again, so the adapter's small update is rounded
    to the 4- or 8-bit grid and the merged model is not the one that was trained and evaluated. Merge
    into the unquantised base instead (``fedtune.algorithms.final.load_base_model(cfg,
    quantized=False)``), as QLoRA adapters are meant to be.
    """
    base: Any = model.get_base_model()
    if getattr(base, "is_quantized", False):
        bits = 4 if getattr(base, "is_loaded_in_4bit", False) else 8
        raise ValueError(
            f"model.quantization {bits}: the LoRA cannot be merged into the {bits}-bit base without "
            f"rounding its update to {bits} bits; load the base without quantisation "
            "(load_base_model(cfg, quantized=False)), put the adapter on it and merge that"
        )
    merged: PreTrainedModel = model.merge_and_unload()
    return merged


def load_adapter(model: PeftModel, state: Mapping[str, torch.Tensor | np.ndarray]) -> None:
    """Put ``state`` into the model's adapter; every adapter key must be present with its shape."""
    parameters = adapter_parameters(model)
    missing = sorted(set(parameters) - set(state))
    if missing:
        raise KeyError(f"adapter state lacks {len(missing)} keys, e.g. {missing[0]}")
    with torch.no_grad():
        for key, target in parameters.items():
            value = state[key]
            tensor = torch.from_numpy(np.asarray(value)) if isinstance(value, np.ndarray) else value
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"adapter key {key}: shape {tuple(tensor.shape)} != {tuple(target.shape)}")
            target.copy_(tensor)
