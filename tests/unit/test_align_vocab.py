"""The minimum-edit-distance vocabulary map: the tie rule, exactness against brute force, the cache."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from fedtune.align import VocabMapStats, brute_force_vocab_map, vocab_map
from fedtune.align.vocab import cache_path, nearest_targets, vocab_map_of_strings
from fedtune.models.tiny import tiny_tokenizer


def test_exact_matches_map_to_themselves_and_duplicates_to_the_smallest_id() -> None:
    targets = ["b", "a", "ab", "a"]

    assert nearest_targets(["a", "ab", "b"], targets).tolist() == [1, 2, 0]


def test_ties_go_to_the_lexicographically_smallest_target_then_the_smallest_id() -> None:
    # "ac" is at distance 1 from "ab", "bc", "c" and "a" (twice); "a" sorts first, id 3 before id 5.
    targets = ["bc", "ab", "c", "a", "zzzz", "a"]

    assert nearest_targets(["ac"], targets).tolist() == [3]
    assert brute_force_vocab_map(["ac"], targets, [0]).tolist() == [3]


def test_a_longer_target_can_win_a_tie_against_a_shorter_one() -> None:
    # Both at distance 1 from "bb"; "abb" (length 3) sorts before "b" (length 1).
    assert nearest_targets(["bb"], ["b", "abb"]).tolist() == [1]


def test_tokens_sharing_no_character_with_any_target() -> None:
    targets = ["xy", "x", "yyyy", "w"]
    sources = ["日本", "日", ""]

    expected = brute_force_vocab_map(sources, targets, [0, 1, 2])
    assert nearest_targets(sources, targets).tolist() == expected.tolist() == [3, 3, 3]


def test_search_equals_brute_force_on_random_vocabularies() -> None:
    rng = random.Random(0)
    alphabet = "ab c\udcc3é"

    def word() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))

    sources = [word() for _ in range(300)]
    targets = [word() for _ in range(200)]

    fast = nearest_targets(sources, targets, workers=2)
    assert fast.tolist() == brute_force_vocab_map(sources, targets, range(len(sources))).tolist()


def test_tiny_tokenizers_of_two_families_map_like_brute_force(tmp_path: Path) -> None:
    source, target = tiny_tokenizer("spm"), tiny_tokenizer("bpe")

    vmap = vocab_map(source, target, cache_dir=tmp_path)

    from fedtune.align import vocabulary_strings

    source_strings, target_strings = vocabulary_strings(source), vocabulary_strings(target)
    assert vmap.dtype == np.int64 and vmap.shape == (len(source),)
    assert vmap.tolist() == brute_force_vocab_map(source_strings, target_strings, range(len(source))).tolist()
    newline = source.convert_tokens_to_ids("<0x0A>")
    assert target_strings[vmap[newline]] == "\n"


def test_the_cache_is_written_once_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources, targets = ["ab", "c"], ["a", "b", "cc"]
    first = vocab_map_of_strings(sources, targets, cache_dir=tmp_path)
    assert cache_path(sources, targets, tmp_path).is_file()

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("recomputed despite an intact cache file")

    monkeypatch.setattr("fedtune.align.vocab.nearest_targets", fail)
    assert vocab_map_of_strings(sources, targets, cache_dir=tmp_path).tolist() == first.tolist()


def test_another_vocabulary_is_a_cache_miss(tmp_path: Path) -> None:
    vocab_map_of_strings(["ab"], ["a", "b"], cache_dir=tmp_path)

    assert vocab_map_of_strings(["ab"], ["b", "a"], cache_dir=tmp_path).tolist() == [1]
    assert len(list(tmp_path.glob("*.npz"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_cache_file_is_recomputed_with_a_warning(tmp_path: Path, damage: str) -> None:
    sources, targets = ["ab", "c", "dd"], ["a", "b", "cc", "d"]
    expected = vocab_map_of_strings(sources, targets, cache_dir=tmp_path).tolist()
    path = cache_path(sources, targets, tmp_path)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "garbage":
        path.write_bytes(b"not a numpy file")
    else:
        tampered = np.asarray([3, 3, 3], dtype=np.int64)
        with np.load(path) as original:
            checksum = original["checksum"]
        np.savez(path, vmap=tampered, checksum=checksum)

    with pytest.warns(UserWarning, match="recomputing"):
        again = vocab_map_of_strings(sources, targets, cache_dir=tmp_path)

    assert again.tolist() == expected
    assert vocab_map_of_strings(sources, targets, cache_dir=tmp_path).tolist() == expected


def test_stats_count_exact_near_and_far() -> None:
    sources, targets = ["a", "ab", "abcd", "wxyz"], ["a", "b"]
    vmap = nearest_targets(sources, targets)

    stats = VocabMapStats.of(sources, targets, vmap, seconds=0.5)

    assert (stats.exact, stats.near, stats.far) == (1, 1, 2)
    assert stats.histogram == {0: 1, 1: 1, 3: 1, 4: 1}


def test_a_directory_where_the_cache_file_goes_is_warned_about_not_fatal(tmp_path: Path) -> None:
    sources, targets = ["ab", "c"], ["a", "b", "cc"]
    cache_path(sources, targets, tmp_path).mkdir(parents=True)

    with pytest.warns(UserWarning, match="is not a file"):
        vmap = vocab_map_of_strings(sources, targets, cache_dir=tmp_path)

    assert vmap.tolist() == vocab_map_of_strings(sources, targets, cache_dir=tmp_path / "other").tolist()


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny SentencePiece-style tokenizer with byte fallback, as Gemma's (no word-start prefix, the
    space written ``▁``): specials, the 256 byte tokens ``<0x00>`` .. ``<0xFF>``, then the pieces. The
    digits, ``a``, ``b``, ``▁`` and ``12`` have a piece; every other character exists only as bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<pad>", "<eos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces += [*"0123456789", "a", "b", "▁", "12", "▁a"]
    vocab = {piece: index for index, piece in enumerate(pieces)}
    merges = [("1", "2"), ("▁", "a")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def test_a_byte_fallback_target_gets_the_piece_its_tokenizer_writes_not_the_byte_token(
    tmp_path: Path,
) -> None:
    """``<0x31>`` and ``1`` both stand for "1"; the tokenizer writes "12" as ``12`` and "1" as ``1``, never
    as ``<0x31>``, so knowledge projected onto the byte token would land on an id never seen as a label."""
    from fedtune.align import vocabulary_strings

    target = byte_fallback_tokenizer()
    source = tiny_tokenizer("bpe")  # byte-level, as SmolLM2's
    target_strings = vocabulary_strings(target)
    byte, piece = target.convert_tokens_to_ids(["<0x31>", "1"])
    assert target_strings[byte] == target_strings[piece] == "1"

    vmap = vocab_map(source, target, cache_dir=tmp_path)

    source_strings = vocabulary_strings(source)
    written = {}
    for source_id, text in enumerate(source_strings):
        if not text or any(0xDC80 <= ord(c) <= 0xDCFF for c in text):  # empty, or a partial byte
            continue
        ids = target(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            written[source_id] = ids[0]
    assert len(written) > 12
    for source_id, target_id in written.items():  # exact matches: the token the tokenizer writes
        assert vmap[source_id] == target_id, repr(source_strings[source_id])
    mapped = {text: vmap[i] for i, text in enumerate(source_strings)}
    assert mapped["1"] == piece
    assert mapped["z"] == target.convert_tokens_to_ids("<0x7A>")  # no piece: the byte token
    # Inexact matches too: no source lands on a byte token whose text also has a piece.
    raw = target.convert_ids_to_tokens(list(range(len(target_strings))))
    with_piece = {
        text for text, token in zip(target_strings, raw, strict=True) if not token.startswith("<0x")
    }
    landed = {int(j) for j in vmap}
    assert not [j for j in landed if raw[j].startswith("<0x") and target_strings[j] in with_piece]
    assert vmap.tolist() == vocab_map(source, target, cache_dir=tmp_path).tolist()  # the cache agrees
