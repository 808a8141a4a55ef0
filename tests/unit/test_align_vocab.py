"""The minimum-edit-distance vocabulary map: the tie rule, exactness against brute force, the cache."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

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
