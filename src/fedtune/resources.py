"""Shared, lazily built resources of one process: each distinct model spec is loaded once.

In the simulation every client runs in the server's process, so clients with equal specs share one
loaded model (and swap their trainable state in and out of it); on Flower a SuperNode's process
loads only what its own client's tasks ask for. Roles get their spec from the algorithm
(``Algorithm.client_model_spec``); the run's ``model:`` section is the default for every role.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from fedtune.config import ExperimentConfig, ModelConfig
from fedtune.models.lora import adapter_arrays, build_lora
from fedtune.models.spec import ModelSpec

T = TypeVar("T")


def model_spec(model: ModelConfig, seed: int) -> ModelSpec:
    """The spec a ``model:`` config section describes (``seed``: the run's, for tiny random models)."""
    return ModelSpec(
        model.name, model.dtype, model.device, model.cache_dir, model.gguf_file, seed, model.quantization
    )


class Resources:
    """A per-process cache of models, tokenizers and anything else built once, keyed by name."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.base_spec = model_spec(cfg.model, cfg.seed)
        self._cache: dict[str, Any] = {}
        self.loads: list[str] = []
        """The spec keys of every model this process loaded, in order (what a test or a report reads)."""

    def get(self, key: str, build: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = build()
        value: T = self._cache[key]
        return value

    def model(self, spec: ModelSpec, copy: str = "") -> tuple[Any, PreTrainedTokenizerBase]:
        """The causal LM ``spec`` names and its tokenizer, loaded on first use.

        Roles asking for the same spec share one model. ``copy`` names a private instance instead, for
        a role that must not see what another does to the shared one (LoRA is attached in place: a
        frozen black-box teacher of the same spec as the tuned model needs its own copy).
        """

        def load() -> tuple[Any, PreTrainedTokenizerBase]:
            self.loads.append(spec.key + (f" ({copy})" if copy else ""))
            return spec.load_causal_lm()

        return self.get(f"model/{spec.key}/{copy}", load)

    def tokenizer(self, spec: ModelSpec) -> PreTrainedTokenizerBase:
        """``spec``'s tokenizer: the loaded model's if there is one, else the tokenizer alone (kept: a
        process that never loads the model, as a Flower server, asks for it again every round)."""
        held = self._held_tokenizer(spec)
        return held if held is not None else self.get(f"tokenizer/{spec.key}", spec.load_tokenizer)

    def vocab_size(self, spec: ModelSpec) -> int:
        """``len`` of ``spec``'s tokenizer (added tokens included), keeping no tokenizer of its own.

        A check made before the models load (FedMKT's ``top_k`` against every vocabulary) would otherwise
        leave a second copy of each tokenizer beside the one its model brings when it loads: Gemma-3's
        holds ~0.3 GB. The one loaded here to measure is dropped, and the model's reuses its memory.
        """

        def measure() -> int:
            held = self._held_tokenizer(spec)
            return len(held if held is not None else spec.load_tokenizer())

        return self.get(f"vocab/{spec.key}", measure)

    def _held_tokenizer(self, spec: ModelSpec) -> PreTrainedTokenizerBase | None:
        """The loaded model's tokenizer, else one loaded alone earlier; None if neither."""
        loaded = self._cache.get(f"model/{spec.key}/")
        return loaded[1] if loaded is not None else self._cache.get(f"tokenizer/{spec.key}")

    def base_lm(self) -> tuple[Any, PreTrainedTokenizerBase]:
        """The run's base model (``model:``)."""
        return self.model(self.base_spec)

    def lora_lm(self) -> tuple[PeftModel, PreTrainedTokenizerBase]:
        """The base LM wrapped once with LoRA; tasks swap adapter states in and out of it."""

        def build() -> tuple[PeftModel, PreTrainedTokenizerBase]:
            model, tokenizer = self.base_lm()
            return build_lora(model, self.cfg.lora, seed=self.cfg.seed), tokenizer

        return self.get("lora_lm", build)

    def initial_adapter(self) -> dict[str, np.ndarray]:
        """The seeded initial adapter state (LoRA B = 0, so the model starts as the base)."""
        model, _ = self.lora_lm()
        return self.get("initial_adapter", lambda: adapter_arrays(model))
