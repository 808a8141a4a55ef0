"""Shared, lazily built resources of one process: each distinct base model is loaded once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from fedtune.config import ExperimentConfig
from fedtune.models.lora import adapter_arrays, attach_lora

T = TypeVar("T")


class Resources:
    """A per-process cache of models and tokenizers keyed by name."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self._cache: dict[str, Any] = {}

    def get(self, key: str, build: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = build()
        value: T = self._cache[key]
        return value

    def base_lm(self) -> tuple[Any, PreTrainedTokenizerBase]:
        from fedtune.models.loading import load_causal_lm

        model_cfg = self.cfg.model
        return self.get(
            "base_lm",
            lambda: load_causal_lm(
                model_cfg.name,
                dtype=model_cfg.dtype,
                device=model_cfg.device,
                cache_dir=None if model_cfg.cache_dir is None else Path(model_cfg.cache_dir).expanduser(),
                gguf_file=model_cfg.gguf_file,
                seed=self.cfg.seed,
            ),
        )

    def lora_lm(self) -> tuple[PeftModel, PreTrainedTokenizerBase]:
        """The base LM wrapped once with LoRA; tasks swap adapter states in and out of it."""

        def build() -> tuple[PeftModel, PreTrainedTokenizerBase]:
            model, tokenizer = self.base_lm()
            lora = self.cfg.lora
            targets = None if lora.target_modules == "auto" else lora.target_modules
            peft_model = attach_lora(
                model,
                r=lora.r,
                alpha=lora.alpha,
                dropout=lora.dropout,
                target_modules=targets,
                seed=self.cfg.seed,
            )
            return peft_model, tokenizer

        return self.get("lora_lm", build)

    def initial_adapter(self) -> dict[str, np.ndarray]:
        """The seeded initial adapter state (LoRA B = 0, so the model starts as the base)."""
        model, _ = self.lora_lm()
        return self.get("initial_adapter", lambda: adapter_arrays(model))
