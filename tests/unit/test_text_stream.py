"""Streaming decode (``TextStream``): the deltas add up to what ``generate_texts`` writes."""

from __future__ import annotations

import pytest
import torch

from fedtune.decode.generate import TextStream, eos_token_ids, generate_texts, model_device, model_step_fn
from fedtune.models.loading import load_causal_lm


@pytest.fixture(scope="module")
def lm() -> tuple[torch.nn.Module, object]:
    # Its greedy text varies (multi-character tokens, a cut multi-byte character): "trueder\x1ctru':Use>z..."
    return load_causal_lm("tiny-qwen2-bpe", seed=1)


def _stream(lm: tuple[torch.nn.Module, object], prompt: str, **kwargs: object) -> TextStream:
    model, tokenizer = lm
    return TextStream(
        model_step_fn(model),
        tokenizer,  # type: ignore[arg-type]
        tokenizer(prompt)["input_ids"],  # type: ignore[operator]
        device=model_device(model),
        eos_token_ids=eos_token_ids(model, tokenizer),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("temperature", "stop"), [(0.0, ()), (1.0, ()), (0.0, ("der",)), (0.0, ("zz", "Use")), (1.0, ("mal",))]
)
def test_stream_equals_generate(
    lm: tuple[torch.nn.Module, object], temperature: float, stop: tuple[str, ...]
) -> None:
    model, tokenizer = lm
    prompt = "Define the word cat."
    expected = generate_texts(
        model,
        tokenizer,  # type: ignore[arg-type]
        [prompt],
        max_new_tokens=24,
        temperature=temperature,
        seed=5,
        stop_strings=list(stop) or None,
    )[0]
    stream = _stream(lm, prompt, max_new_tokens=24, temperature=temperature, seed=5, stop_strings=stop)
    deltas = list(stream)
    assert "".join(deltas) == expected
    assert stream.finish_reason in (("stop",) if stop else ("stop", "length"))  # each stop string is met
    assert 1 <= stream.new_tokens <= 24
    assert len(deltas) > 1  # token by token, not in one piece


def test_stop_string_is_held_back_until_it_is_decided(lm: tuple[torch.nn.Module, object]) -> None:
    # A stop string spanning two tokens of the greedy text (the first token's last character and the
    # second's first): nothing from its first character on may be sent, although that character
    # arrived a step before the rest of it.
    deltas = list(_stream(lm, "Define the word cat.", max_new_tokens=12))
    free = "".join(deltas)
    boundary = len(deltas[0])
    assert len(deltas) >= 2 and boundary >= 2
    stop = free[boundary - 1 : boundary + 1]
    stream = _stream(lm, "Define the word cat.", max_new_tokens=12, stop_strings=(stop,))
    sent = list(stream)
    assert "".join(sent) == free[: free.find(stop)] and free.find(stop) < boundary
    assert stream.finish_reason == "stop"


def test_closed_stream_stops(lm: tuple[torch.nn.Module, object]) -> None:
    stream = _stream(lm, "Hello", max_new_tokens=50)
    next(stream)
    stream.close()
    assert list(stream) == [] and stream.finish_reason == "cancelled"
