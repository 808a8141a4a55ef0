"""Proxy-tuning needs the small and the large model to share a vocabulary: check it before training."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class VocabMismatch(ValueError):
    """The two models do not share token ids: their logits cannot be added."""


def shared_vocab_size(
    small: PreTrainedTokenizerBase,
    small_width: int,
    large: PreTrainedTokenizerBase,
    large_width: int,
    *,
    small_name: str = "small model",
    large_name: str = "large model",
) -> int:
    """The number of leading ids whose logits may be combined; raises ``VocabMismatch`` otherwise.

    ``*_width`` is each model's number of logit columns (often larger than its tokenizer: Qwen2.5
    pads its embedding to 151,936 rows for 151,665 tokens). Every id both tokenizers know must map
    to the same token string, and the EOS tokens must agree; extra trailing ids in one model are
    dropped, as in proxy-tuning.
    """
    small_vocab, large_vocab = len(small), len(large)
    common = min(small_vocab, large_vocab)
    small_tokens = small.convert_ids_to_tokens(list(range(common)))
    large_tokens = large.convert_ids_to_tokens(list(range(common)))
    differ = [i for i, (a, b) in enumerate(zip(small_tokens, large_tokens, strict=True)) if a != b]
    if differ:
        examples = ", ".join(f"id {i}: {small_tokens[i]!r} vs {large_tokens[i]!r}" for i in differ[:3])
        raise VocabMismatch(
            f"{small_name} and {large_name} do not share a vocabulary: {len(differ)} of the first {common} "
            f"token ids map to different strings ({examples}). Proxy-tuning needs a same-tokenizer pair, "
            "e.g. `fedtune models derive` to build a small model from the large one."
        )
    if small.eos_token != large.eos_token:
        raise VocabMismatch(
            f"{small_name} ends text with {small.eos_token!r} but {large_name} with {large.eos_token!r}"
        )
    width = min(small_width, large_width)
    if width < common:
        raise VocabMismatch(
            f"a model has fewer logit columns ({width}) than tokens both tokenizers know ({common})"
        )
    return width
