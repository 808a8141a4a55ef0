"""Proxy-tuned decoding: FedPT's output model (the large LM steered by the tuned small LM).

Every step runs three models, each with its own KV cache, and combines their next-token logits
with ``proxy_logits`` (``z = z_large + alpha * (z_tuned - z_base)``) before ``sample_next``. The
tuned small model is a peft LoRA model and the base small model is the same module with the
adapter off, so the small weights are held once. The large model is reached only through a
``LogitSource``, never through its weights.

The two small forwards are fused by default into one forward of ``2B`` rows: the first ``B`` with
the adapter, the second ``B`` without (peft's mixed-adapter batches, ``adapter_names=[..., "__base__"]``;
one KV cache holds both halves). A batch-1 decoding step is bound by reading the weights, not by
arithmetic, so the base forward almost comes for free (bench/proxy_decoding.py). ``fuse_small=False`` runs the
two forwards one after the other under ``disable_adapter()``; it also serves adapters that peft
cannot mix in one batch (DoRA, merged adapters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from peft import PeftModel
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from fedtune.decode.generate import (
    DecodeOptions,
    StepFn,
    decode_texts,
    eos_token_ids,
    evaluating,
    model_device,
    model_step_fn,
)
from fedtune.proxy.arith import proxy_logits
from fedtune.proxy.source import LogitSource
from fedtune.proxy.vocab import shared_vocab_size
from fedtune.train import losses

if TYPE_CHECKING:
    from typing import Unpack

SmallStepFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""Like ``StepFn``, but returns the next-token logits of the tuned and the base small model."""

BASE_ADAPTER = "__base__"
"""peft's name for "no adapter" in a mixed-adapter batch."""


class ProxyTunedLM:
    """The proxy-tuned large LM ``(large, small + adapter, small, alpha)``.

    It is itself a ``LogitSource`` (``session``, ``labelled_logits``, ...), so it can stand in
    wherever one is expected, e.g. as a distillation teacher. The logits cover the first
    ``vocab_width`` ids: by default the width ``shared_vocab_size`` allows, which checks that the
    two tokenizers agree (``VocabMismatch`` otherwise).
    """

    def __init__(
        self,
        large: LogitSource,
        small: PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        alpha: float,
        vocab_width: int | None = None,
        *,
        fuse_small: bool = True,
    ) -> None:
        base_model: Any = small.get_base_model()
        small_width = int(base_model.get_output_embeddings().weight.shape[0])
        shared = shared_vocab_size(
            tokenizer, small_width, large.tokenizer, large.vocab_width, large_name=large.name
        )
        if vocab_width is not None and not 0 < vocab_width <= shared:
            raise ValueError(f"vocab_width must be in [1, {shared}] (the shared width), got {vocab_width}")
        self.large, self.small, self.alpha, self.fuse_small = large, small, alpha, fuse_small
        self._tokenizer = tokenizer
        self._vocab_width = vocab_width or shared
        self.name = f"{large.name} proxy-tuned"

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def vocab_width(self) -> int:
        return self._vocab_width

    @property
    def device(self) -> torch.device:
        """Where the combined logits live: the small model's device."""
        return model_device(self.small)

    def eos_token_ids(self) -> list[int]:
        """Either model's EOS ends a row: chat models often list several."""
        return sorted(set(eos_token_ids(self.small, self._tokenizer)) | set(self.large.eos_token_ids()))

    def session(self) -> StepFn:
        return self.step_fn()

    def step_fn(self, alpha: float | None = None, cached: bool = True) -> StepFn:
        """A fresh ``StepFn`` giving proxy logits ``[B, vocab_width]``; the small model must be in eval mode.

        ``cached=False`` is the reference: every call re-runs the three models (unfused) over the
        whole sequence so far with no KV cache.
        """
        if self.small.training:
            raise RuntimeError("the small model is in training mode: decode inside `evaluating(small)`")
        strength = self.alpha if alpha is None else alpha
        if not cached:
            return self._uncached_step_fn(strength)
        small_step = self._fused_small_step_fn() if self.fuse_small else self._separate_small_step_fn()
        return self._combined_step_fn(self.large.session(), small_step, strength)

    def generate(
        self, prompts: Sequence[str], *, alpha: float | None = None, **options: Unpack[DecodeOptions]
    ) -> list[str]:
        """The text the proxy-tuned LM writes after each prompt (see ``decode_texts``)."""
        with evaluating(self.small):
            return decode_texts(
                lambda: self.step_fn(alpha),
                self._tokenizer,
                prompts,
                device=self.device,
                eos_token_ids=self.eos_token_ids(),
                **options,
            )

    def labelled_logits(self, batch: Mapping[str, Tensor], alpha: float | None = None) -> Tensor:
        """``[N, vocab_width]`` proxy logits at the positions predicting a labelled token."""
        parts = self.labelled_parts(batch)
        return self.combine(parts, self.alpha if alpha is None else alpha)

    def labelled_parts(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The large, tuned small and base small LMs' logits at the positions predicting a labelled
        token: what `labelled_logits` combines, to combine at several alphas with one forward each."""
        device = self.device
        on_device = {key: value.to(device) for key, value in batch.items()}
        with evaluating(self.small):
            tuned, _ = losses.labelled_logits(self.small, on_device)
            with self.small.disable_adapter():
                base, _ = losses.labelled_logits(self.small, on_device)
        large = self.large.labelled_logits(batch).to(device)
        return large, tuned, base

    def combine(self, parts: tuple[Tensor, Tensor, Tensor], alpha: float) -> Tensor:
        """`labelled_parts` as the proxy's logits at strength ``alpha``."""
        large, tuned, base = parts
        return proxy_logits(large, tuned, base, alpha, self._vocab_width)

    def _combined_step_fn(self, large_step: StepFn, small_step: SmallStepFn, alpha: float) -> StepFn:
        large_device = self.large.device

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
            large = large_step(
                new_ids.to(large_device), attention_mask.to(large_device), position_ids.to(large_device)
            )
            with torch.inference_mode():
                tuned, base = small_step(new_ids, attention_mask, position_ids)
            return proxy_logits(large.to(tuned.device), tuned, base, alpha, self._vocab_width)

        return step

    def _separate_small_step_fn(self) -> SmallStepFn:
        tuned_step, base_step = model_step_fn(self.small), model_step_fn(self.small)

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
            tuned = tuned_step(new_ids, attention_mask, position_ids)
            with self.small.disable_adapter():
                base = base_step(new_ids, attention_mask, position_ids)
            return tuned, base

        return step

    def _fused_small_step_fn(self) -> SmallStepFn:
        """Rows ``[:B]`` run with the adapter and rows ``[B:]`` without it, in one forward and one cache."""
        adapter = self.small.active_adapter
        cache: Any = None

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
            nonlocal cache
            rows = new_ids.shape[0]
            output = self.small(
                input_ids=new_ids.repeat(2, 1),
                attention_mask=attention_mask.repeat(2, 1),
                position_ids=position_ids.repeat(2, 1),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                adapter_names=[adapter] * rows + [BASE_ADAPTER] * rows,
            )
            cache = output.past_key_values
            logits = output.logits[:, -1, :].float()
            return logits[:rows], logits[rows:]

        return step

    def _uncached_step_fn(self, alpha: float) -> StepFn:
        seen: tuple[Tensor, Tensor] | None = None

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
            nonlocal seen
            if seen is not None:
                new_ids = torch.cat([seen[0], new_ids], dim=1)
                position_ids = torch.cat([seen[1], position_ids], dim=1)
            seen = (new_ids, position_ids)
            # Fresh sessions have empty caches: each call is one full forward per model.
            fresh = self._combined_step_fn(self.large.session(), self._separate_small_step_fn(), alpha)
            return fresh(new_ids, attention_mask, position_ids)

        return step
