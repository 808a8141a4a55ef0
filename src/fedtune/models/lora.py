"""LoRA attach and adapter state get/set, through peft's public API only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import PreTrainedModel

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
    target_modules: Sequence[str] | None = None,
    seed: int = 0,
    task_type: str = "CAUSAL_LM",
) -> PeftModel:
    """Wrap ``model`` with a freshly (seeded) initialised LoRA adapter; base weights are frozen."""
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules or default_targets(model)),
        task_type=task_type,
        # GPT-2 stores its projections as Conv1D (weight transposed).
        fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2",
    )
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors (detached copies), keyed as peft names them."""
    return {key: value.detach().clone() for key, value in get_peft_model_state_dict(model).items()}


def adapter_arrays(model: PeftModel) -> dict[str, np.ndarray]:
    """Adapter state as float32 numpy arrays, ready for a payload."""
    return {key: value.detach().float().cpu().numpy().copy() for key, value in adapter_state(model).items()}


def load_adapter(model: PeftModel, state: Mapping[str, torch.Tensor | np.ndarray]) -> None:
    """Put ``state`` into the model's adapter; every adapter key must be present with its shape."""
    expected = get_peft_model_state_dict(model)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise KeyError(f"adapter state lacks {len(missing)} keys, e.g. {missing[0]}")
    tensors = {}
    for key, target in expected.items():
        value = state[key]
        tensor = torch.from_numpy(np.asarray(value)) if isinstance(value, np.ndarray) else value
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"adapter key {key}: shape {tuple(tensor.shape)} != {tuple(target.shape)}")
        tensors[key] = tensor.to(dtype=target.dtype, device=target.device)
    set_peft_model_state_dict(model, tensors)
