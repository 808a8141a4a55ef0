"""A FedIT run on SmolLM2 exported as GGUF (llama.cpp's converter, fetched from the pinned llama-cpp-python
sdist) and run by llama.cpp's own runtime: the same tokens, greedy continuations and perplexity as the
merged export in transformers.

Skipped without llama-cpp-python (``pip install llama-cpp-python==<fedtune.models.llama_cpp.VERSION>``,
built from the same sdist). The first run downloads the sdist into the cache (the registry must be
reachable once). Prints the measured figures (run with ``-s`` to see them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedtune.config import load_config
from fedtune.data.records import Record
from fedtune.data.templates import alpaca_prompt
from fedtune.export import GGUF_FILE, export_run
from fedtune.rundata import prepare_data
from tests.e2e.conftest import DEMO, PROMPTS, SHORT

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="needs llama-cpp-python (llama.cpp's runtime) to load the GGUF file"
)
pytestmark = pytest.mark.slow

NEW_TOKENS = 16
TEXTS = 20
TOLERANCE = {"f32": 0.01, "f16": 0.01, "q8_0": 0.03}
"""Largest relative perplexity difference from transformers; f32 and f16 also decode greedily the same."""


@pytest.fixture(scope="module")
def merged(smollm2_fedit_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tmp_path_factory.mktemp("merged")
    export_run(smollm2_fedit_run, "merged", directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Test examples of the run's data set as the model reads them in training (prompt, then answer)."""
    records = prepare_data(load_config(DEMO, [*SHORT, f"eval.max_examples={TEXTS}"])).eval_records
    assert len(records) == TEXTS
    return [alpaca_prompt(record) + record.output for record in records]


def hf_greedy(model: Any, ids: list[int]) -> list[int]:
    tokens = list(ids)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(ids) :]


def gguf_greedy(llm: Any, ids: list[int]) -> list[int]:
    llm.reset()
    llm.eval(ids)
    tokens: list[int] = []
    for _ in range(NEW_TOKENS):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(tokens[-1:])
    return tokens


def token_nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Negative log-likelihood of each next token: logits [T, V], ids [T] -> [T - 1]."""
    shifted = logits[:-1].astype(np.float64)
    log_z = np.log(np.exp(shifted - shifted.max(-1, keepdims=True)).sum(-1)) + shifted.max(-1)
    return log_z - shifted[np.arange(len(ids) - 1), ids[1:]]


def hf_perplexity(model: Any, encoded: list[list[int]]) -> float:
    with torch.no_grad():
        nll = [token_nll(model(torch.tensor([ids])).logits[0].numpy(), ids) for ids in encoded]
    return math.exp(float(np.concatenate(nll).mean()))


def gguf_perplexity(llm: Any, encoded: list[list[int]]) -> float:
    nll = []
    for ids in encoded:
        llm.reset()
        llm.eval(ids)
        nll.append(token_nll(np.array(llm.scores[: len(ids)]), ids))
    return math.exp(float(np.concatenate(nll).mean()))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
def test_gguf_in_llama_cpp_decodes_as_the_merged_model_in_transformers(
    outtype: str,
    smollm2_fedit_run: Path,
    merged: tuple[Any, Any],
    texts: list[str],
    tmp_path: Path,
) -> None:
    # Prepare
    model, tokenizer = merged
    export_run(smollm2_fedit_run, "gguf", tmp_path, outtype=outtype)
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / GGUF_FILE), n_ctx=512, logits_all=True, n_threads=2, verbose=False
    )
    prompts = [alpaca_prompt(Record(instruction, "-")) for instruction in PROMPTS]
    encoded_prompts = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    encoded_texts = [tokenizer(text)["input_ids"] for text in texts]

    # Execute
    same_tokens = [
        llm.tokenize(text.encode(), add_bos=False, special=True) == ids
        for text, ids in zip([*prompts, *texts], [*encoded_prompts, *encoded_texts], strict=True)
    ]
    expected = [hf_greedy(model, ids) for ids in encoded_prompts]
    continued = [gguf_greedy(llm, ids) for ids in encoded_prompts]
    reference, measured = hf_perplexity(model, encoded_texts), gguf_perplexity(llm, encoded_texts)

    # Assert
    agree = sum(np.equal(expected, continued).flatten())
    ratio = measured / reference
    print(
        f"\n{outtype}: {(tmp_path / GGUF_FILE).stat().st_size / 1e6:.0f} MB, tokenizer agrees on "
        f"{sum(same_tokens)}/{len(same_tokens)} texts, greedy tokens {agree}/{len(PROMPTS) * NEW_TOKENS} "
        f"equal, perplexity transformers {reference:.4f} / llama.cpp {measured:.4f} ({ratio - 1:+.2%})"
    )
    assert all(same_tokens)
    assert abs(ratio - 1) < TOLERANCE[outtype]
    if outtype != "q8_0":
        assert continued == expected
