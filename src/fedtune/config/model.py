"""The ``model:`` and ``lora:`` sections: the base model a run loads and the LoRA trained on it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config.base import Section


class ModelConfig(Section):
    name: str = "smollm2-135m-instruct"
    """A zoo name, a local directory, a `.gguf` file, a Hugging Face id or a tiny test model (`tiny-llama`,
    `tiny-qwen2`, `tiny-gpt2`)."""
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """`auto`: fp32 on CPU, bf16 on GPU."""
    device: str = "auto"
    """`auto`: the CUDA GPU if there is one, else the CPU; or a torch device (`cuda:1`)."""
    gguf_file: str | None = None
    """The file inside a GGUF repository or directory to load."""
    cache_dir: str | None = None
    """The model cache (default `$FEDTUNE_CACHE` or `~/.cache/fedtune`)."""
    quantization: Literal[4, 8] | None = None
    """4: the base model's linear layers in bitsandbytes NF4 (double quantisation, computing in `dtype`);
    8: LLM.int8. The LoRA trained on top stays fp32 (QLoRA); embeddings, norms and the head are not
    quantised. Applies to every LoRA base loaded from this section (and FedMKT's fedmkt.clients);
    FedBiOT and FedPFT refuse it (see docs/memory.md). Needs `pip install 'fedtune[quant]'`."""


class LoraConfig(Section):
    r: int = Field(8, ge=1)
    """LoRA rank."""
    alpha: int = Field(16, gt=0)
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(0.05, ge=0, lt=1)
    """LoRA dropout."""
    target_modules: list[str] | Literal["auto"] = "auto"
    """The adapted projections; `auto`: q and v projections."""
