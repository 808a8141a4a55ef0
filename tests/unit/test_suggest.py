"""The one "did you mean" of every unknown-name error."""

from __future__ import annotations

from fedtune.suggest import closest


def test_closest_is_the_most_similar_choice() -> None:
    assert closest("fed.round", ["fed.rounds", "fed.mode", "seed"]) == "fed.rounds"


def test_closest_is_none_below_the_cutoff() -> None:
    assert closest("xyz", ["fed.rounds"]) is None
    assert closest("tiny-lama", ["tiny-llama"], cutoff=0.99) is None


def test_closest_takes_any_iterable() -> None:
    assert closest("fp61", (name for name in ("fp16", "bf16", "fp32"))) == "fp16"
