import inspect
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

import fedtune.decode.generate as generate
import fedtune.proxy.decode as proxy_decode
from fedtune.decode.generate import (
    DecodeOptions,
    decode_loop,
    decode_texts,
    generate_texts,
    model_step_fn,
    pad_sequences,
    positions_from_mask,
    sample_next,
    top_p_filter,
)
from fedtune.eval.scoring import evaluate_generation
from fedtune.models.lora import attach_lora
from fedtune.models.tiny import tiny_model, tiny_tokenizer
from fedtune.proxy import LocalLogitSource, ProxyTunedLM

PROMPTS = ["hello there", "a", "the quick brown fox", "xyz", "Q: 2+2?"]


class ScriptedLM(nn.Module):
    """Writes ``script`` then EOS whatever the prompt; its "cache" is the number of steps taken."""

    def __init__(self, script: list[int], vocab_size: int, eos_id: int) -> None:
        super().__init__()
        self.script, self.vocab_size, self.eos_id = script, vocab_size, eos_id
        self.anchor = nn.Parameter(torch.zeros(1))
        self.num_calls = 0

    def forward(self, input_ids: Tensor, past_key_values: int | None = None, **_: Any) -> SimpleNamespace:
        self.num_calls += 1
        step = past_key_values or 0
        token = self.script[step] if step < len(self.script) else self.eos_id
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        logits[..., token] = 1.0
        return SimpleNamespace(logits=logits, past_key_values=step + 1)


class EchoLM(nn.Module):
    """Predicts the last token it was given, so a prompt's last character repeats."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(
            logits=nn.functional.one_hot(input_ids, self.vocab_size).float(), past_key_values=None
        )


def untied_tiny_model(arch: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny model whose head is not the embedding: a tied random llama only copies its last token."""
    model, tokenizer = tiny_model(arch, seed=1)
    head = model.get_output_embeddings()
    torch.manual_seed(2)
    head.weight = nn.Parameter(torch.randn_like(head.weight))
    return model, tokenizer


def left_padded(tokenizer: PreTrainedTokenizerFast, prompts: list[str]) -> tuple[Tensor, Tensor]:
    return pad_sequences(tokenizer(prompts)["input_ids"], tokenizer.pad_token_id, side="left")


def test_pad_sequences_left_and_right() -> None:
    # Execute
    left_ids, left_mask = pad_sequences([[5, 6, 7], [8]], 0, side="left")
    right_ids, right_mask = pad_sequences([[5, 6, 7], [8]], 0, side="right")

    # Assert
    assert left_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert left_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert right_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert right_mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_positions_from_mask_count_real_tokens_only() -> None:
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 0]]


def test_top_p_filter_keeps_smallest_set_reaching_top_p() -> None:
    # Prepare: probabilities 0.5, 0.2, 0.3 -> sorted 0.5, 0.3 reach 0.6
    logits = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.3)]])

    # Execute
    kept = torch.isfinite(top_p_filter(logits, 0.6))
    only_top = torch.isfinite(top_p_filter(logits, 0.01))

    # Assert
    assert kept.tolist() == [[True, False, True]]
    assert only_top.tolist() == [[True, False, False]]


def test_sample_next_greedy_and_seeded_top_p() -> None:
    # Prepare
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]]).repeat(200, 1)

    # Execute
    greedy = sample_next(logits, 0.0, 1.0, None)
    first = sample_next(logits, 1.0, 0.8, torch.Generator().manual_seed(3))
    second = sample_next(logits, 1.0, 0.8, torch.Generator().manual_seed(3))

    # Assert: p = .64, .24, .09, .03 so top-p 0.8 leaves tokens 1 and 2
    assert greedy.tolist() == [1] * 200
    assert torch.equal(first, second)
    assert set(first.tolist()) == {1, 2}


def hf_greedy(model: Any, input_ids: Tensor, attention_mask: Tensor, **kwargs: Any) -> Tensor:
    """New tokens from ``model.generate(do_sample=False)``: ``[B,P] -> [B,N]``."""
    with torch.inference_mode():
        output: Tensor = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False, **kwargs
        )
    return output[:, input_ids.shape[1] :]


def our_greedy(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, **kwargs: Any) -> Tensor:
    with torch.inference_mode():
        return decode_loop(model_step_fn(model), input_ids, attention_mask, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decode_loop_greedy_equals_hf_generate(arch: str) -> None:
    # Prepare
    model, tokenizer = untied_tiny_model(arch)
    input_ids, attention_mask = left_padded(tokenizer, PROMPTS[:4])

    # Execute
    expected = hf_greedy(model, input_ids, attention_mask, max_new_tokens=12)
    ours = our_greedy(
        model,
        input_ids,
        attention_mask,
        max_new_tokens=12,
        eos_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )

    # Assert
    assert len(set(expected.flatten().tolist())) > 4, "degenerate output would make the check weak"
    assert torch.equal(ours, expected)


def test_decode_loop_stops_rows_at_eos_like_hf_generate() -> None:
    # Prepare: declare a token row 0 emits mid-way to be EOS, so rows stop at different steps
    model, tokenizer = untied_tiny_model("llama")
    input_ids, attention_mask = left_padded(tokenizer, PROMPTS[:4])
    free_run = our_greedy(
        model, input_ids, attention_mask, max_new_tokens=10, eos_token_ids=[-1], pad_token_id=0
    )
    eos_id = int(free_run[0, 4])

    # Execute
    expected = hf_greedy(
        model,
        input_ids,
        attention_mask,
        max_new_tokens=10,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    ours = our_greedy(
        model,
        input_ids,
        attention_mask,
        max_new_tokens=10,
        eos_token_ids=[eos_id],
        pad_token_id=tokenizer.pad_token_id,
    )

    # Assert
    assert ours.shape[1] > 5
    assert (ours[0, 5:] == tokenizer.pad_token_id).all()
    assert torch.equal(ours, expected)


def test_generate_texts_batch_size_does_not_change_greedy_output() -> None:
    # Prepare
    model, tokenizer = untied_tiny_model("llama")

    # Execute
    one_by_one = generate_texts(model, tokenizer, PROMPTS, max_new_tokens=6, batch_size=1)
    batched = generate_texts(model, tokenizer, PROMPTS, max_new_tokens=6, batch_size=8)

    # Assert
    assert batched == one_by_one


def test_generate_texts_sampling_is_reproducible_with_a_seed() -> None:
    # Prepare
    model, tokenizer = tiny_model("qwen2")
    prompts = PROMPTS[:4]

    # Execute
    first = generate_texts(model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    again = generate_texts(model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    other = generate_texts(model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=8)

    # Assert
    assert first == again
    assert first != other


def test_generate_texts_stops_at_eos_and_drops_special_tokens() -> None:
    # Prepare
    tokenizer = tiny_tokenizer()
    model = ScriptedLM(tokenizer("hi")["input_ids"], len(tokenizer), tokenizer.eos_token_id)

    # Execute
    texts = generate_texts(model, tokenizer, ["a", "longer prompt"], max_new_tokens=20)

    # Assert
    assert texts == ["hi", "hi"]


def test_generate_texts_cuts_before_stop_string() -> None:
    # Prepare
    tokenizer = tiny_tokenizer()
    model = ScriptedLM(tokenizer("ab###cd")["input_ids"], len(tokenizer), tokenizer.eos_token_id)
    # Execute
    texts = generate_texts(model, tokenizer, ["q"], max_new_tokens=20, stop_strings=["###", "zz"])

    # Assert: decoding stopped right after the fifth token completed "###"
    assert texts == ["ab"]
    assert model.num_calls == 5


def test_generate_texts_returns_prompts_in_original_order() -> None:
    # Prepare: lengths 1, 3, 2 so sorting by length reorders them across two batches
    tokenizer = tiny_tokenizer()
    model = EchoLM(len(tokenizer))
    reported: list[tuple[int, int]] = []

    # Execute
    texts = generate_texts(
        model,
        tokenizer,
        ["a", "ccc", "bb"],
        max_new_tokens=2,
        batch_size=2,
        progress=lambda done, total: reported.append((done, total)),
    )

    # Assert
    assert texts == ["aa", "cc", "bb"]
    assert reported == [(2, 3), (3, 3)]


def test_a_watcher_hears_every_decoder_that_has_no_progress_of_its_own() -> None:
    # Prepare: the watcher is how `fedtune eval` shows generation, whichever decoder the model plugs in
    tokenizer = tiny_tokenizer()
    model = EchoLM(len(tokenizer))
    heard: list[tuple[int, int]] = []
    own: list[tuple[int, int]] = []

    # Execute
    with generate.watching(lambda done, total: heard.append((done, total))):
        generate_texts(model, tokenizer, ["a", "ccc", "bb"], max_new_tokens=1, batch_size=2)
        generate_texts(
            model, tokenizer, ["a"], max_new_tokens=1, progress=lambda done, total: own.append((done, total))
        )
    generate_texts(model, tokenizer, ["a", "b"], max_new_tokens=1, batch_size=1)

    # Assert: each batch of the first call; a call's own progress wins; outside the block nothing
    assert heard == [(2, 3), (3, 3)]
    assert own == [(1, 1)]


def test_generate_texts_restores_training_mode() -> None:
    # Prepare
    model, tokenizer = tiny_model("gpt2")
    model.train()

    # Execute
    texts = generate_texts(model, tokenizer, ["hi"], max_new_tokens=2)

    # Assert
    assert len(texts) == 1
    assert model.training


def test_decode_options_are_every_option_of_decode_texts() -> None:
    defaults = {
        name
        for name, parameter in inspect.signature(decode_texts).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    assert set(DecodeOptions.__annotations__) == defaults


def test_every_generating_entry_point_hands_decode_texts_the_same_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare
    received: list[dict[str, Any]] = []

    def recording_decode_texts(*args: Any, device: Any, eos_token_ids: Any, **options: Any) -> list[str]:
        received.append(options)
        return [""] * len(args[2])

    monkeypatch.setattr(generate, "decode_texts", recording_decode_texts)
    monkeypatch.setattr(proxy_decode, "decode_texts", recording_decode_texts)
    model, tokenizer = tiny_model("llama")
    small = attach_lora(tiny_model("llama")[0], r=2, alpha=4, dropout=0.0, seed=0)
    proxy = ProxyTunedLM(LocalLogitSource(model, tokenizer), small, tokenizer, alpha=1.0)
    options: DecodeOptions = {
        "max_new_tokens": 3,
        "batch_size": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 5,
        "stop_strings": ["\n"],
        "progress": None,
    }
    prompts = PROMPTS[:2]

    # Execute
    generate_texts(model, tokenizer, prompts, **options)
    proxy.generate(prompts, alpha=0.5, **options)
    evaluate_generation(model, tokenizer, prompts, ["a", "b"], ["x", "y"], **options)
    generate_texts(model, tokenizer, prompts)

    # Assert
    assert received == [options, options, options, {}]
