"""configs/scale/: the 7-8B recipes validate, and each recipe's architecture trains with LoRA.

Nothing is downloaded: each recipe's hub id maps to its architecture's structural settings as
published in the model's config.json (GQA head ratio, rope, norms, tied embeddings, biases), and the
test builds that architecture at random init and tiny width (same ratios, a few layers) on the CPU,
checks that the full-size settings give the published parameter count (on the meta device, no memory)
and runs one forward and backward of a LoRA step with gradient checkpointing, the recipe's LoRA rank
and target modules. What the test cannot catch: the real weights, tokenizer and chat template (it
never sees them) and anything CUDA- or bitsandbytes-specific (tests/gpu/ covers those on a GPU).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config

from fedtune.config import validate_config
from fedtune.models.lora import adapter_parameters, attach_lora

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "scale").glob("*.yaml"))

# hub id -> (config class, the published structural settings, the published parameter count)
ARCHITECTURES: dict[str, tuple[type[PretrainedConfig], dict[str, Any], float]] = {
    "Qwen/Qwen2.5-7B-Instruct": (
        Qwen2Config,
        {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,  # GQA 7:1
            "vocab_size": 152064,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "hidden_act": "silu",
        },
        7.62e9,
    ),
    "meta-llama/Llama-3.1-8B-Instruct": (
        LlamaConfig,
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,  # GQA 4:1
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "hidden_act": "silu",
        },
        8.03e9,
    ),
}


def _recipe(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text())
    assert isinstance(raw, dict)
    return raw


def _tiny(settings: dict[str, Any]) -> dict[str, Any]:
    """The architecture at tiny width: head dim 16, the same query/key-value head ratio and FFN ratio,
    2 layers, a 512-token vocabulary; rope, norms, biases and tying as published."""
    ratio = settings["num_attention_heads"] // settings["num_key_value_heads"]
    kv_heads = 2 if ratio <= 4 else 1
    heads = kv_heads * ratio
    hidden = 16 * heads
    ffn = round(hidden * settings["intermediate_size"] / settings["hidden_size"] / 8) * 8
    return settings | {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 256,
    }


def test_there_is_a_recipe_for_each_architecture() -> None:
    names = {_recipe(path)["model"]["name"] for path in RECIPES}
    assert names == set(ARCHITECTURES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_validates_as_fedit_qlora_on_ray_one_actor_per_gpu(path: Path) -> None:
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("model.quantization validates only where bitsandbytes is installed")
    cfg = validate_config(_recipe(path), str(path))
    assert cfg.algorithm == "fedit" and cfg.model.quantization == 4 and cfg.model.dtype == "bf16"
    assert 16 <= cfg.lora.r <= 32 and cfg.train.gradient_checkpointing
    assert cfg.fed.backend == "ray" and cfg.ray.num_gpus == 1 and cfg.ray.actors >= 1
    assert cfg.model.device == "auto"  # each actor resolves the GPU Ray gave it


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_the_recipes_architecture_has_its_published_size(path: Path) -> None:
    config_class, settings, published = ARCHITECTURES[_recipe(path)["model"]["name"]]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_class(**settings))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_the_recipes_architecture_takes_a_lora_step_at_tiny_width(path: Path) -> None:
    # Prepare: the architecture at tiny width with the recipe's LoRA and checkpointing
    recipe = _recipe(path)
    config_class, settings, _ = ARCHITECTURES[recipe["model"]["name"]]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_class(**_tiny(settings)))
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = recipe["lora"]
    peft_model = attach_lora(
        model, r=lora["r"], alpha=lora["alpha"], dropout=0.0, target_modules=lora["target_modules"]
    )
    peft_model.train()
    params = adapter_parameters(peft_model)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    # Execute
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    # Assert: every target module of every layer got LoRA, and every LoRA matrix B a gradient
    tiny = _tiny(settings)
    assert len(params) == 2 * len(lora["target_modules"]) * tiny["num_hidden_layers"]
    # The GQA ratio survives the shrinking: k_proj is heads / kv_heads times narrower than q_proj.
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.out_features == tiny["num_attention_heads"] * 16
    assert attention.k_proj.out_features * settings["num_attention_heads"] == (
        attention.q_proj.out_features * settings["num_key_value_heads"]
    )
    assert torch.isfinite(loss)
    grads = {name: p.grad for name, p in params.items()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert all(g is not None and g.abs().sum() > 0 for name, g in grads.items() if "lora_B" in name)
