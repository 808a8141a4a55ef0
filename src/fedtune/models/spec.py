"""ModelSpec: which model a role (the server, each client) uses and how it is loaded.

One value names the model and everything that changes what gets loaded -- so two roles with equal
specs share one loaded model in a process (``fedtune.resources.Resources``), and a role with another
spec (another architecture, another tokenizer, another dtype) gets its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """A model to load.

    ``name``: a zoo name, a derived name (``fedtune models derive``), a Hugging Face id, a local
    directory, or a tiny random model ``tiny-<arch>[-L<layers>-H<hidden>]``; ``dtype``: auto, fp32,
    bf16 or fp16; ``device``: auto, cpu, cuda, cuda:N; ``cache_dir``: where zoo and hub files live;
    ``gguf_file``: the GGUF file inside a directory or repository; ``seed``: the initialisation of
    tiny random models; ``quantization``: 4 or 8 for a bitsandbytes-quantised base (QLoRA), None for
    none (``model.quantization``).
    """

    name: str
    dtype: str = "auto"
    device: str = "auto"
    cache_dir: str | None = None
    gguf_file: str | None = None
    seed: int = 0
    quantization: int | None = None

    @property
    def key(self) -> str:
        """A stable text key: equal specs, equal keys."""
        return "|".join(f"{field.name}={getattr(self, field.name)}" for field in dataclasses.fields(self))

    @property
    def cache_path(self) -> Path | None:
        return None if self.cache_dir is None else Path(self.cache_dir).expanduser()

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    def load_causal_lm(self) -> tuple[Any, Any]:
        """The model (on ``device``, in ``dtype``) and its tokenizer."""
        from fedtune.models.loading import load_causal_lm

        return load_causal_lm(
            self.name,
            dtype=self.dtype,
            device=self.device,
            cache_dir=self.cache_path,
            gguf_file=self.gguf_file,
            seed=self.seed,
            quantization=self.quantization,
        )

    def load_tokenizer(self) -> Any:
        """The tokenizer alone (a client that receives its weights need not load the model)."""
        from fedtune.models.loading import load_tokenizer

        return load_tokenizer(self.name, cache_dir=self.cache_path, gguf_file=self.gguf_file)
