"""The compiled target index of the vocabulary map: tie order, distances, and the search against the
brute force on hand-made and random vocabularies."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numba
import numpy as np
import pytest
from rapidfuzz.distance import Levenshtein

from fedtune.align import brute_force_vocab_map, vocab_index
from fedtune.align.vocab_index import TargetIndex, code_points, tie_order


def brute(sources: list[str], targets: list[str]) -> list[int]:
    return brute_force_vocab_map(sources, targets, range(len(sources))).tolist()


def nearest(sources: list[str], targets: list[str], workers: int = 1) -> list[int]:
    return TargetIndex.build(targets).nearest(sources, workers=workers).tolist()


def test_code_points_keep_surrogates_and_astral_characters() -> None:
    codes, offsets = code_points(["a\udcc3", "", "😀é"])

    assert codes.tolist() == [ord("a"), 0xDCC3, ord("😀"), ord("é")]
    assert offsets.tolist() == [0, 2, 2, 4]


def test_tie_order_is_python_string_order_then_id() -> None:
    rng = random.Random(1)
    # Long shared prefixes (runs of equal first-three-character keys), equal strings, prefixes of
    # each other, surrogates and astral characters.
    stems = ["", "a", "ab", "abc", "abcd", "abcdefg", "\udcc3", "😀", "\uffff"]
    strings = [rng.choice(stems) + rng.choice(stems) + rng.choice(["", "x", "abc"]) for _ in range(400)]
    codes, offsets = code_points(strings)

    order = tie_order(codes, offsets)

    assert order.tolist() == sorted(range(len(strings)), key=lambda i: (strings[i], i))


def test_bit_parallel_and_table_distances_agree_with_rapidfuzz_and_honour_the_cutoff() -> None:
    rng = random.Random(2)
    alphabet = "abcde"
    for _ in range(300):
        source = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 70)))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 70)))
        expected = Levenshtein.distance(source, text)
        dense = np.asarray([alphabet.index(c) for c in text], dtype=np.int32)
        src = np.asarray([alphabet.index(c) for c in source], dtype=np.int32)
        for cutoff in (0, 2, expected, 200):
            want = expected if expected <= cutoff else cutoff + 1
            got_table = vocab_index._distance_table(src, 0, src.size, dense, 0, dense.size, cutoff)
            assert got_table == want
            if len(source) <= 64:
                peq = np.zeros(len(alphabet), dtype=np.uint64)
                for i, char in enumerate(source):
                    peq[alphabet.index(char)] |= np.uint64(1) << np.uint64(i)
                got_bits = vocab_index._distance_bits(peq, len(source), dense, 0, dense.size, cutoff)
                assert got_bits == want


def test_ties_duplicates_and_exact_matches() -> None:
    # Duplicated strings: the smallest id. "bb" is at distance 1 from "b", "abb", "ab" and "bc": the
    # smallest string "ab" wins; "ba" from "b", "bc", "a" (twice) and "ab" (substitution): "a", id 2.
    targets = ["b", "abb", "a", "ab", "a", "bc"]
    sources = ["a", "ab", "bb", "ba", "zzz", "bc", "abbb"]

    assert nearest(sources, targets) == brute(sources, targets) == [2, 3, 3, 2, 2, 5, 1]


def test_empty_strings_on_both_sides() -> None:
    assert nearest(["", "a"], ["", "b", ""]) == brute(["", "a"], ["", "b", ""]) == [0, 0]
    # No empty target: the empty source is at distance 1 from every one-character target.
    assert nearest([""], ["xy", "c", "b"]) == brute([""], ["xy", "c", "b"]) == [2]


def test_byte_tokens_and_characters_in_no_target() -> None:
    # Lone surrogates stand for partial UTF-8 bytes (see fedtune.align.tokens).
    targets = ["\udcc3", "\udcc3\udca9", "é", " é", "e", "日"]
    sources = ["\udcc3\udca8", "é\udcc3", "本日", "本本", "\udca9", "ǿ"]

    assert nearest(sources, targets) == brute(sources, targets)


def test_a_source_that_shares_only_one_character_picks_the_first_of_thousands_of_ties() -> None:
    rng = random.Random(3)
    words = {" " + "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 8))) for _ in range(3000)}
    targets = [*sorted(words), "\n", "\t\t", "x"]
    rng.shuffle(targets)
    sources = [" ক্যান্টনমেন্ট", " প্লা", "ক্যা"]

    assert nearest(sources, targets) == brute(sources, targets)


def test_long_strings_use_the_table_distance() -> None:
    targets = ["-" * 16, "-" * 70 + "a", "a" * 65, "ab" * 40, "b"]
    sources = ["-" * 128, "-" * 66, "a" * 80, "ba" * 33, "b" * 65]

    assert nearest(sources, targets) == brute(sources, targets)


def test_a_target_longer_than_every_source_and_the_only_one() -> None:
    assert nearest(["a", "", "abc"], ["xyzw"]) == [0, 0, 0]


@pytest.mark.parametrize("seed", range(6))
def test_search_equals_brute_force_on_random_vocabularies(seed: int) -> None:
    rng = random.Random(seed)
    # Small alphabets give many ties and repeated characters; a large one exceeds the 63 signature
    # bits of their own; lengths up to 70 reach the table distance.
    cyrillic = "".join(map(chr, range(0x400, 0x480)))
    alphabet = ["ab", "ab c\udcc3é", "abcdefghij klmno", cyrillic + " e"][seed % 4]
    longest = 70 if seed == 5 else 9

    def word() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, rng.choice([3, longest]))))

    targets = [word() for _ in range(rng.randint(1, 400))]
    sources = [word() for _ in range(300)] + rng.sample(targets, min(20, len(targets)))

    assert nearest(sources, targets) == brute(sources, targets)


def test_threads_give_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)

    def word() -> str:
        return "".join(rng.choice("abcd ef") for _ in range(rng.randint(0, 8)))

    targets = [word() for _ in range(300)]
    sources = [word() for _ in range(200)]
    monkeypatch.setattr(vocab_index, "_PARALLEL_FROM", 0)

    threaded = nearest(sources, targets, workers=2)
    assert threaded == nearest(sources, targets, workers=1) == brute(sources, targets)


THREADS_AFTER_A_SEARCH = """
import torch
from fedtune.align import vocab_index
from fedtune.align.vocab_index import TargetIndex
print(torch.get_num_threads())
vocab_index._PARALLEL_FROM = 0
TargetIndex.build(["a", "b", "ab"]).nearest(["ab", "ba", "abc"], workers=2)
print(torch.get_num_threads())
"""


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one numba thread here: no threaded search")
def test_a_threaded_search_leaves_torch_at_its_thread_count() -> None:
    """numba's OpenMP layer shares torch's libgomp and, on its first threaded launch in a process, set
    OpenMP to numba's thread count (every CPU): torch then computed on every CPU for the rest of the
    run, whatever OMP_NUM_THREADS said. A fresh process, as that first launch happens once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", THREADS_AFTER_A_SEARCH]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True, env=env)
    assert done.stdout.split() == ["1", "1"]  # torch's count before the search, and after it


def test_an_empty_target_vocabulary_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        TargetIndex.build([])
