"""Token strings in one canonical form across tokenizer families.

The canonical form of a token is **the text it stands for**: a word-start marker becomes the space
it encodes, a byte token becomes its byte. FuseLLM / FATE-LLM instead replace one family's marker by
the other's (``▁`` <-> ``Ġ``); for word-start markers the two agree (one character either way, so
edit distances are the same), but only the text form also equates GPT-2's ``Ċ`` with SentencePiece's
``<0x0A>`` and with a literal ``"\\n"`` token, which FATE-LLM maps by edit distance to whatever
spells closest.

Families (detected from the fast tokenizer's pipeline, see `tokenizer_family`):
- ``byte-level`` (GPT-2, SmolLM2, Qwen2.5): every character stands for one byte (``Ġ`` = space,
  ``Ċ`` = newline, ``Ã©`` = the two bytes of ``é``); the bytes are decoded as UTF-8.
- ``sentencepiece`` (Llama 1/2, Gemma): ``▁`` is a space; byte-fallback tokens ``<0xHH>`` are byte HH.
- ``plain`` (anything else, e.g. WordPiece): the token string unchanged.

A byte that is not valid UTF-8 on its own (half of ``é``) becomes the lone surrogate U+DC80+byte
(Python's ``surrogateescape``), the same for a byte-level token and a ``<0xC3>`` byte token, so both
families' partial bytes compare equal. Print such strings with `display_token`.
Added tokens (``<|im_start|>``, Gemma's ``"\\n\\n"``) are stored as their text already and are kept
as they are.
"""

from __future__ import annotations

import contextlib
import json
import re
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

TokenizerFamily = Literal["byte-level", "sentencepiece", "plain"]
FAMILIES: tuple[TokenizerFamily, ...] = ("byte-level", "sentencepiece", "plain")
SPM_SPACE = "▁"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character -> the byte it encodes (inverse of ``bytes_to_unicode``)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def is_byte_token(token: str) -> bool:
    """Whether a SentencePiece vocabulary token is a byte-fallback token (``<0x31>``)."""
    return _BYTE_TOKEN.fullmatch(token) is not None


def _decode_bytes(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def normalize_token(token: str, family: TokenizerFamily) -> str:
    """The text a vocabulary token of ``family`` stands for (see the module docstring)."""
    if family == "byte-level":
        table = _byte_level_decoder()
        # A character outside GPT-2's table cannot come from its byte encoding: keep it as text.
        data = b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in token)
        return _decode_bytes(data)
    if family == "sentencepiece":
        byte = _BYTE_TOKEN.fullmatch(token)
        if byte is not None:
            return _decode_bytes(bytes([int(byte[1], 16)]))
        return token.replace(SPM_SPACE, " ")
    if family == "plain":
        return token
    raise ValueError(f"unknown tokenizer family {family!r}; choose one of {', '.join(FAMILIES)}")


def _components(node: Any) -> list[dict[str, Any]]:
    """A pipeline step and, for a ``Sequence``, the steps inside it."""
    if not isinstance(node, dict):
        return []
    inner = node.get("decoders") or node.get("pretokenizers") or []
    return [node, *(step for child in inner for step in _components(child))]


def _family_of_pipeline(spec: dict[str, Any]) -> TokenizerFamily | None:
    steps = _components(spec.get("decoder")) + _components(spec.get("pre_tokenizer"))
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" in kinds:
        return "byte-level"
    spm_replace = any(
        step.get("type") == "Replace" and step.get("pattern", {}).get("String") == SPM_SPACE for step in steps
    )
    if "Metaspace" in kinds or spm_replace or spec.get("model", {}).get("byte_fallback"):
        return "sentencepiece"
    return None


# Per tokenizer object: detecting the family parses the tokenizer's whole JSON (about 2 s for
# Gemma-3's 262k vocabulary), and `token_strings` runs once per sequence.
_FAMILIES: weakref.WeakKeyDictionary[Any, TokenizerFamily] = weakref.WeakKeyDictionary()


def tokenizer_family(tokenizer: Any) -> TokenizerFamily:
    """The family of a Hugging Face tokenizer: from its fast pipeline when it has one, else from
    which marker its vocabulary uses most. Detected once per tokenizer object."""
    with contextlib.suppress(KeyError, TypeError):  # not seen yet, or not weakly referenceable
        return _FAMILIES[tokenizer]
    family = _detect_family(tokenizer)
    with contextlib.suppress(TypeError):
        _FAMILIES[tokenizer] = family
    return family


def _detect_family(tokenizer: Any) -> TokenizerFamily:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        found = _family_of_pipeline(json.loads(backend.to_str()))
        if found is not None:
            return found
    vocab = tokenizer.get_vocab()
    spm = sum(token.startswith(SPM_SPACE) for token in vocab)
    byte_level = sum(token.startswith("Ġ") for token in vocab)
    if max(spm, byte_level) < len(vocab) // 20:
        return "plain"
    return "sentencepiece" if spm > byte_level else "byte-level"


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The canonical strings of token ``ids`` of ``tokenizer``; an id without a token gives ``""``."""
    family = tokenizer_family(tokenizer)
    added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items()}
    id_list = [int(i) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(id_list)
    return [
        added[index] if index in added else normalize_token(token, family) if token is not None else ""
        for index, token in zip(id_list, raw, strict=True)
    ]


def vocabulary_strings(tokenizer: Any) -> list[str]:
    """`token_strings` of every id ``0 .. len(tokenizer) - 1`` (added and special tokens included)."""
    return token_strings(tokenizer, range(len(tokenizer)))


def display_token(text: str) -> str:
    """A printable form of a canonical string: Python escapes for control characters, ``\\xHH`` for a
    lone byte."""
    parts = []
    for char in text:
        if 0xDC80 <= ord(char) <= 0xDCFF:
            parts.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            parts.append(char if char.isprintable() else repr(char)[1:-1])
    return "".join(parts)
