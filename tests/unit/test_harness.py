"""The lm-eval wrapper's pure helpers: lm-eval's truncation, the labelled batch, the score table."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from fedtune.data.builtin import list_builtin
from fedtune.harness import HarnessError, check_tasks, task_scores
from fedtune.harness.model import IGNORE_INDEX, labelled_batch, truncated_pair
from fedtune.harness.tasks import builtin_task_names


def test_a_long_pair_loses_the_contexts_first_tokens_keeping_max_length_plus_one() -> None:
    assert truncated_pair([1, 2, 3, 4, 5], [6, 7], max_length=4) == ([3, 4, 5], [6, 7])
    assert truncated_pair([1, 2], [3], max_length=4) == ([1, 2], [3])


def test_a_continuation_longer_than_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="3 tokens exceeds the 2-token context"):
        truncated_pair([1], [2, 3, 4], max_length=2)


def test_the_batch_labels_only_the_continuations_and_pads_on_the_right() -> None:
    batch = labelled_batch([([5, 6], [7]), ([8], [9, 10, 11])], pad_id=0)

    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    ignored = IGNORE_INDEX
    assert batch["labels"].tolist() == [[ignored, ignored, 7, ignored], [ignored, 9, 10, 11]]


def test_task_scores_drop_the_filter_and_keep_numbers() -> None:
    results = {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1, "exact_match,strict": 1}}
    assert task_scores(results) == {"t": {"acc": 0.5, "acc_stderr": 0.1, "exact_match,strict": 1.0}}


def test_every_built_in_set_is_a_task_and_a_typo_gets_the_closest_name() -> None:
    names = builtin_task_names()
    assert names == sorted(f"fedtune-{info.name}" for info in list_builtin())
    with pytest.raises(HarnessError, match="did you mean 'fedtune-arith-choice'"):
        check_tasks(["fedtune-arith-choise"], names)
