"""Canonical token strings: markers, byte tokens, added tokens, family detection."""

from __future__ import annotations

import pytest

from fedtune.align import display_token, normalize_token, token_strings, tokenizer_family
from fedtune.models.tiny import tiny_tokenizer


@pytest.mark.parametrize(
    ("token", "family", "text"),
    [
        ("Ġthe", "byte-level", " the"),
        ("Ċ", "byte-level", "\n"),
        ("ĉĠĠ", "byte-level", "\t  "),
        ("Ã©", "byte-level", "é"),
        ("Ã", "byte-level", "\udcc3"),
        ("▁the", "sentencepiece", " the"),
        ("▁▁", "sentencepiece", "  "),
        ("<0x0A>", "sentencepiece", "\n"),
        ("<0xC3>", "sentencepiece", "\udcc3"),
        ("<0xc3>x", "sentencepiece", "<0xc3>x"),
        ("##ing", "plain", "##ing"),
    ],
)
def test_normalize_token_maps_markers_and_bytes_to_text(token: str, family: str, text: str) -> None:
    assert normalize_token(token, family) == text  # type: ignore[arg-type]


def test_partial_bytes_of_both_families_are_equal() -> None:
    byte_level = [normalize_token(t, "byte-level") for t in ("Ã", "©")]
    sentencepiece = [normalize_token(t, "sentencepiece") for t in ("<0xC3>", "<0xA9>")]

    assert byte_level == sentencepiece
    assert "".join(byte_level).encode("utf-8", "surrogateescape").decode() == "é"


def test_unknown_family_is_an_error() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        normalize_token("a", "wordpiece")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("family", "expected"), [("byte", "byte-level"), ("bpe", "byte-level"), ("spm", "sentencepiece")]
)
def test_family_is_detected_from_the_pipeline(family: str, expected: str) -> None:
    assert tokenizer_family(tiny_tokenizer(family)) == expected


def test_token_strings_of_different_families_spell_the_same_text() -> None:
    text = "The cat sat.\nDefine 'dog': é"
    spelled = []
    for family in ("byte", "bpe", "spm"):
        tokenizer = tiny_tokenizer(family)
        strings = token_strings(tokenizer, tokenizer(text)["input_ids"])
        spelled.append("".join(strings).encode("utf-8", "surrogateescape").decode().lstrip(" "))

    assert spelled == [text] * 3


def test_special_tokens_stay_as_they_are() -> None:
    tokenizer = tiny_tokenizer("spm")
    ids = tokenizer.convert_tokens_to_ids(["<|bos|>", "<|eos|>", "<0x0A>"])

    assert token_strings(tokenizer, ids) == ["<|bos|>", "<|eos|>", "\n"]


def test_display_token_escapes_control_characters_and_lone_bytes() -> None:
    assert display_token(" a\n\udcc3") == " a\\n\\xc3"


def test_a_tokenizer_pipeline_is_read_once_not_per_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading the pipeline means parsing the tokenizer's whole JSON (2 s for Gemma-3's 262k
    # vocabulary): FedMKT's public views call token_strings once per public example.
    from fedtune.align import tokens

    reads = []
    real = tokens._family_of_pipeline
    monkeypatch.setattr(tokens, "_family_of_pipeline", lambda spec: reads.append(1) or real(spec))
    first, second = tiny_tokenizer("bpe"), tiny_tokenizer("spm")
    for _ in range(3):
        token_strings(first, [1, 2, 3])
        token_strings(second, [1, 2, 3])
    assert tokenizer_family(first) == "byte-level" and tokenizer_family(second) == "sentencepiece"
    assert len(reads) == 2
