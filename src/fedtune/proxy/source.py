"""The large model as a black box: next-token logits only, never its weights.

FedPT's server may reach the large LM only through its predictions. ``LogitSource`` is that
boundary: scoring a teacher-forced batch (for distillation and perplexity) and incremental
decoding sessions (for proxy-tuned generation). ``LocalLogitSource`` serves a local model;
``fedtune.proxy.http_source.HTTPLogitSource`` a model behind an OpenAI-compatible API (vLLM, or
``fedtune serve MODEL``) that returns log-probabilities by token id.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from fedtune.decode.generate import (
    StepFn,
    context_length,
    eos_token_ids,
    evaluating,
    model_device,
    model_step_fn,
)
from fedtune.train.losses import labelled_logits


@runtime_checkable
class LogitSource(Protocol):
    """Next-token logits of a language model whose weights the caller never sees."""

    name: str

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def vocab_width(self) -> int:
        """Number of logit columns."""
        ...

    @property
    def device(self) -> torch.device: ...

    def eos_token_ids(self) -> list[int]: ...

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """``[N, V]`` float logits at the positions predicting a labelled token (``labels[t+1] != -100``)."""
        ...

    def session(self) -> StepFn:
        """A fresh incremental decoding session with its own KV cache (see ``decode.generate.StepFn``)."""
        ...


class LocalLogitSource:
    """A local causal LM behind the ``LogitSource`` interface (inference only)."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, name: str = "large") -> None:
        self._model = model.eval()
        for param in self._model.parameters():
            param.requires_grad_(False)
        self._tokenizer = tokenizer
        self.name = name

    @property
    def max_model_len(self) -> int | None:
        """The most tokens the model takes (its config's), as a server's ``max_model_len``."""
        return context_length(self._model)

    @classmethod
    def load(
        cls,
        name: str,
        *,
        dtype: str = "fp32",
        device: str = "auto",
        cache_dir: Path | None = None,
        seed: int = 0,
    ) -> LocalLogitSource:
        from fedtune.models.loading import load_causal_lm

        model, tokenizer = load_causal_lm(name, dtype=dtype, device=device, cache_dir=cache_dir, seed=seed)
        return cls(model, tokenizer, name)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def vocab_width(self) -> int:
        width: Any = self._model.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
        return int(width)

    @property
    def device(self) -> torch.device:
        return model_device(self._model)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self._model.parameters())

    def eos_token_ids(self) -> list[int]:
        return eos_token_ids(self._model, self._tokenizer)

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        device = self.device
        with evaluating(self._model):
            logits, _ = labelled_logits(self._model, {k: v.to(device) for k, v in batch.items()})
        return logits.float()

    def session(self) -> StepFn:
        step = model_step_fn(self._model)

        def run(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
            with torch.inference_mode():
                return step(new_ids, attention_mask, position_ids)

        return run
