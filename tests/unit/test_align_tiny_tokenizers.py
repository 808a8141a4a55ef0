"""Tiny tokenizer families chosen by the model name's suffix."""

from __future__ import annotations

import pytest

from fedtune.models.loading import ModelError, TinySpec, load_causal_lm, load_tokenizer, parse_tiny_name
from fedtune.models.tiny import SPECIAL_TOKENS, TINY_TOKENIZERS, tiny_tokenizer


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("tiny-llama", TinySpec("llama", 2, 32, "byte")),
        ("tiny-llama-spm", TinySpec("llama", 2, 32, "spm")),
        ("tiny-qwen2-L4-H64-bpe", TinySpec("qwen2", 4, 64, "bpe")),
    ],
)
def test_tokenizer_suffix_is_parsed(name: str, spec: TinySpec) -> None:
    assert parse_tiny_name(name) == spec


def test_unknown_suffix_lists_the_valid_ones() -> None:
    with pytest.raises(
        ModelError, match="unknown tokenizer suffix -wordpiece; valid suffixes: -byte, -bpe, -spm"
    ):
        parse_tiny_name("tiny-llama-wordpiece")


def test_families_differ_in_vocabulary_and_ids_but_share_specials_and_template() -> None:
    tokenizers = {family: tiny_tokenizer(family) for family in TINY_TOKENIZERS}

    assert len({len(tok) for tok in tokenizers.values()}) == 3
    assert tokenizers["bpe"].convert_ids_to_tokens(300) != tokenizers["spm"].convert_ids_to_tokens(300)
    for tok in tokenizers.values():
        assert set(SPECIAL_TOKENS) <= set(tok.all_special_tokens)
        assert tok.chat_template == tokenizers["byte"].chat_template
    assert "Ġthe" in tokenizers["bpe"].get_vocab() and "▁the" in tokenizers["spm"].get_vocab()
    assert "<0x0A>" in tokenizers["spm"].get_vocab()


def test_learned_families_are_deterministic_and_round_trip_text() -> None:
    text = "Define 'river': water that runs to the sea. Ünïcode ✓\n"
    for family in ("bpe", "spm"):
        first, second = tiny_tokenizer(family), tiny_tokenizer(family)
        ids = first(text, add_special_tokens=False)["input_ids"]

        assert first.get_vocab() == second.get_vocab()
        assert first.decode(ids) == text


def test_byte_family_is_unchanged() -> None:
    tokenizer = tiny_tokenizer()

    assert len(tokenizer) == 262 and tokenizer.pad_token_id == 256
    assert tokenizer("ab é")["input_ids"] == [64, 65, 220, 127, 102]


def test_loaders_honour_the_suffix() -> None:
    model, tokenizer = load_causal_lm("tiny-llama-spm", device="cpu")

    assert len(tokenizer) == len(tiny_tokenizer("spm"))
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert load_tokenizer("tiny-gpt2-bpe").get_vocab() == tiny_tokenizer("bpe").get_vocab()
