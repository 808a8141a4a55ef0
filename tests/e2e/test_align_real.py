"""The vocabulary map of the real SmolLM2 -> Qwen2.5 pair equals brute force on a sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.align import (
    brute_force_vocab_map,
    one_to_one,
    preferred_ids,
    token_strings,
    vocab_map,
    vocabulary_strings,
)
from fedtune.models.zoo import zoo_path

PAIR = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tokenizers() -> tuple[object, object]:
    missing = [name for name in PAIR if zoo_path(name) is None]
    if missing:
        pytest.skip(f"not fetched yet: {', '.join(missing)} (fedtune models fetch NAME)")
    from fedtune.models.loading import load_tokenizer

    return load_tokenizer(PAIR[0]), load_tokenizer(PAIR[1])


@pytest.mark.slow
def test_smollm2_to_qwen_map_equals_brute_force_on_a_sample(
    tokenizers: tuple[object, object], tmp_path: Path
) -> None:
    source, target = tokenizers
    vmap = vocab_map(source, target, cache_dir=tmp_path)
    source_strings, target_strings = vocabulary_strings(source), vocabulary_strings(target)
    sample = np.random.default_rng(0).choice(len(source_strings), 200, replace=False).tolist()

    assert vmap.shape == (len(source_strings),)
    expected = brute_force_vocab_map(source_strings, target_strings, sample, preferred_ids(target))
    assert vmap[sample].tolist() == expected.tolist()
    assert np.array_equal(vocab_map(source, target, cache_dir=tmp_path), vmap)


@pytest.mark.slow
def test_shared_words_are_matched_one_to_one(tokenizers: tuple[object, object]) -> None:
    source, target = tokenizers
    text = "Define 'river': a natural stream of water larger than a creek."
    strings = [token_strings(tok, tok(text)["input_ids"]) for tok in (source, target)]  # type: ignore[operator]

    match = one_to_one(*strings)

    assert (match >= 0).mean() > 0.8
    assert all(strings[0][i] == strings[1][j] for j, i in enumerate(match.tolist()) if i >= 0)
