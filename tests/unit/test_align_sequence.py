"""DTW alignment of two tokenizations, 1:1 matches, and the projection of top-k logits."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fedtune.align import (
    agreeing_matches,
    align_sequences,
    brute_force_align_sequences,
    one_to_one,
    project_topk,
)


def test_equal_tokenizations_align_on_the_diagonal() -> None:
    tokens = ["The", " cat", " sat", "."]

    assert align_sequences(tokens, tokens) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert one_to_one(tokens, tokens).tolist() == [0, 1, 2, 3]


def test_a_split_token_is_matched_to_both_pieces_and_is_not_one_to_one() -> None:
    source = [" Hello", " world", "!"]
    target = [" Hel", "lo", " world", "!"]

    assert align_sequences(source, target) == [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert one_to_one(source, target).tolist() == [-1, -1, 1, 2]


def test_a_merge_is_the_mirror_of_a_split() -> None:
    source = [" Hel", "lo", " world"]
    target = [" Hello", " world"]

    assert align_sequences(source, target) == [(0, 0), (1, 0), (2, 1)]
    assert one_to_one(source, target).tolist() == [-1, 2]


def test_ties_take_the_diagonal_first_then_the_source_step() -> None:
    # Every cell costs 1: the diagonal wins at (1, 1); from (2, 1) the source step beats the target step.
    assert align_sequences(["a", "b", "c"], ["x", "y"]) == [(0, 0), (1, 0), (2, 1)]
    assert brute_force_align_sequences(["a", "b", "c"], ["x", "y"]) == [(0, 0), (1, 0), (2, 1)]


def test_empty_sequences_have_no_path() -> None:
    assert align_sequences([], ["a"]) == []
    assert one_to_one(["a"], []).tolist() == []
    assert one_to_one([], ["a", "b"]).tolist() == [-1, -1]


def test_compiled_alignment_equals_the_python_loop_on_random_strings() -> None:
    rng = random.Random(0)

    def tokens() -> list[str]:
        return [
            "".join(rng.choice("ab ") for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(1, 12))
        ]

    for _ in range(300):
        source, target = tokens(), tokens()
        assert align_sequences(source, target) == brute_force_align_sequences(source, target)


def test_agreeing_matches_drop_pairs_that_neither_spell_alike_nor_map() -> None:
    source, target = ["ab", "c"], ["a", "bc"]
    match = one_to_one(source, target)
    assert match.tolist() == [0, 1]
    vmap = np.array([5, 7])  # "ab" -> id 5 (the target's "a" has id 5), "c" -> 7

    kept = agreeing_matches(match, np.array([0, 1]), np.array([5, 6]), vmap, source, target)

    assert kept.tolist() == [0, -1]


VMAP = np.array([10, 11, 10, 12, 13])


def test_project_topk_maps_ids_in_order_and_the_first_assignment_wins() -> None:
    source_ids = np.array([[2, 0, 3, 1], [4, 3, -1, -1]])
    source_values = np.array([[4.0, 3.0, 2.0, 1.0], [1.5, 0.5, 0.0, 0.0]])

    ids, values = project_topk(source_ids, source_values, np.array([1, 0]), VMAP, np.array([99, 98]))

    # Row 1 <- source row 0: ids 2, 0 both map to 10; the first (value 4.0) stays.
    assert ids.tolist() == [[13, 12, -1, -1], [10, 12, 11, -1]]
    np.testing.assert_array_equal(values, [[1.5, 0.5, -np.inf, -np.inf], [4.0, 2.0, 1.0, -np.inf]])
    assert ids.dtype == np.int64 and values.dtype == np.float32


def test_project_topk_gives_unmatched_and_all_padding_rows_a_one_hot() -> None:
    source_ids = np.array([[1, 2], [-1, -1]])
    source_values = np.array([[1.0, 2.0], [0.0, 0.0]])

    ids, values = project_topk(source_ids, source_values, np.array([-1, 1, 0]), VMAP, np.array([7, 8, 9]))

    assert ids.tolist() == [[7, -1], [8, -1], [11, 10]]
    np.testing.assert_array_equal(values, [[0.0, -np.inf], [0.0, -np.inf], [1.0, 2.0]])


def test_project_topk_rejects_a_flat_topk() -> None:
    with pytest.raises(ValueError, match=r"\[S, k\]"):
        project_topk(np.array([1, 2]), np.array([1.0, 2.0]), np.array([0]), VMAP, np.array([3]))
