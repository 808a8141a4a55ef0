"""Proxy-tuned decoding: the logit arithmetic, the vocabulary check and the three-model decode loop."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

import fedtune.algorithms.fedpt.final as fedpt
import fedtune.artifacts as artifacts
from fedtune.algorithms.fedpt import load_proxy_model
from fedtune.algorithms.final import FinalModelError
from fedtune.config import dump_config, load_config, load_run_config
from fedtune.decode.generate import (
    StepFn,
    decode_loop,
    evaluating,
    generate_texts,
    model_step_fn,
    pad_sequences,
)
from fedtune.models.loading import load_causal_lm
from fedtune.models.lora import attach_lora
from fedtune.models.tiny import tiny_tokenizer
from fedtune.proxy import (
    LocalLogitSource,
    LogitSource,
    ProxyTunedLM,
    VocabMismatch,
    proxy_logits,
    shared_vocab_size,
)

PROMPTS = ["hello there", "a", "the quick brown fox", "xyz", "Q: 2+2?"]
SMALL, LARGE = "tiny-llama-L2-H32", "tiny-llama-L4-H64"
TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test" / "fedit-tiny.yaml"


def untied(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny model with a random head: with the tied embedding a random llama only repeats its last token."""
    model, tokenizer = load_causal_lm(name, seed=seed)
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(
        torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(seed + 1))
    )
    return model, tokenizer


def tuned_small(seed: int = 0) -> tuple[PeftModel, PreTrainedTokenizerFast]:
    """The small model with a LoRA adapter whose B is random, so tuned != base."""
    model, tokenizer = untied(SMALL, seed)
    small = attach_lora(model, r=4, alpha=8, dropout=0.0, seed=seed)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, param in small.named_parameters():
            if "lora_B" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return small.eval(), tokenizer


def large_source() -> LocalLogitSource:
    model, tokenizer = untied(LARGE, 10)
    return LocalLogitSource(model, tokenizer, LARGE)


def left_padded(tokenizer: PreTrainedTokenizerBase) -> tuple[Tensor, Tensor]:
    return pad_sequences(tokenizer(PROMPTS)["input_ids"], int(tokenizer.pad_token_id), side="left")


def recorded(step: StepFn, logits: list[Tensor]) -> StepFn:
    def run(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        logits.append(step(new_ids, attention_mask, position_ids))
        return logits[-1]

    return run


def greedy(
    step: StepFn, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int = 12, eos: list[int] | None = None
) -> Tensor:
    """New tokens ``[B, N]`` for ``PROMPTS``; without ``eos`` it never stops early."""
    input_ids, attention_mask = left_padded(tokenizer)
    return decode_loop(
        step,
        input_ids,
        attention_mask,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos or [],
        pad_token_id=int(tokenizer.pad_token_id),
    )


def swapped_tokenizer(first: str, second: str) -> PreTrainedTokenizerFast:
    """The tiny byte-level tokenizer with the ids of two tokens exchanged."""
    vocab = tiny_tokenizer().get_vocab()
    vocab[first], vocab[second] = vocab[second], vocab[first]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|pad|>", eos_token="<|eos|>", unk_token="<|unk|>"
    )


class ScriptedSource:
    """A ``LogitSource`` writing ``script`` then EOS, with logits far above any small-model delta."""

    def __init__(self, script: list[int], tokenizer: PreTrainedTokenizerBase) -> None:
        self.script, self.name, self._tokenizer = script, "scripted", tokenizer

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def vocab_width(self) -> int:
        return len(self._tokenizer)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def eos_token_ids(self) -> list[int]:
        return [int(self._tokenizer.eos_token_id)]

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def session(self) -> StepFn:
        steps = 0

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
            nonlocal steps
            token = self.script[steps] if steps < len(self.script) else self.eos_token_ids()[0]
            steps += 1
            logits = torch.zeros(new_ids.shape[0], self.vocab_width)
            logits[:, token] = 1e4
            return logits

        return step


# ---- proxy arithmetic ----


def test_proxy_logits_truncates_to_the_narrowest_width() -> None:
    # Prepare
    large, tuned, base = torch.randn(3, 10), torch.randn(3, 8), torch.randn(3, 9)

    # Execute
    combined = proxy_logits(large, tuned, base, alpha=1.5)

    # Assert
    assert combined.shape == (3, 8) and combined.dtype == torch.float32
    torch.testing.assert_close(combined, large[:, :8] + 1.5 * (tuned - base[:, :8]))
    with pytest.raises(ValueError, match="exceeds"):
        proxy_logits(large, tuned, base, alpha=1.0, vocab_size=9)


def test_proxy_logits_alpha_zero_is_the_large_logits() -> None:
    large = torch.randn(2, 4, 6, dtype=torch.float16)

    combined = proxy_logits(large, torch.randn(2, 4, 6), torch.randn(2, 4, 6), alpha=0.0)

    assert torch.equal(combined, large.float())


def test_proxy_logits_is_the_product_of_experts_in_probability_form() -> None:
    # Prepare: p ∝ p_large * (p_tuned / p_base)^alpha (FedPT eq. 12)
    torch.manual_seed(0)
    large, tuned, base, alpha = torch.randn(4, 7), torch.randn(4, 7), torch.randn(4, 7), 1.8
    p_large, p_tuned, p_base = large.softmax(-1), tuned.softmax(-1), base.softmax(-1)
    unnormalised = p_large * (p_tuned / p_base) ** alpha

    # Execute
    combined = proxy_logits(large, tuned, base, alpha)

    # Assert
    torch.testing.assert_close(combined.softmax(-1), unnormalised / unnormalised.sum(-1, keepdim=True))


# ---- vocabulary check ----


def test_shared_vocab_size_allows_logits_wider_than_the_tokenizer() -> None:
    # Qwen2.5-style: both heads have padding columns beyond the tokenizer's ids.
    tokenizer = tiny_tokenizer()

    width = shared_vocab_size(tokenizer, len(tokenizer) + 8, tiny_tokenizer(), len(tokenizer) + 30)

    assert width == len(tokenizer) + 8


def test_shared_vocab_size_rejects_swapped_tokens_and_too_few_columns() -> None:
    tokenizer = tiny_tokenizer()
    with pytest.raises(VocabMismatch, match="2 of the first"):
        shared_vocab_size(tokenizer, len(tokenizer), swapped_tokenizer("a", "b"), len(tokenizer))
    with pytest.raises(VocabMismatch, match="fewer logit columns"):
        shared_vocab_size(tokenizer, len(tokenizer) - 1, tiny_tokenizer(), len(tokenizer))


def test_proxy_model_rejects_a_large_model_with_another_vocabulary() -> None:
    # Prepare
    small, tokenizer = tuned_small()
    large_model, _ = untied(LARGE, 10)
    large = LocalLogitSource(large_model, swapped_tokenizer("x", "y"), "swapped")

    # Execute / Assert
    with pytest.raises(VocabMismatch, match="do not share a vocabulary"):
        ProxyTunedLM(large, small, tokenizer, alpha=1.0)


# ---- decoding ----


def test_alpha_zero_reproduces_the_large_models_greedy_output() -> None:
    # Prepare
    small, tokenizer = tuned_small()
    large_model, large_tokenizer = untied(LARGE, 10)
    proxy = ProxyTunedLM(LocalLogitSource(large_model, large_tokenizer), small, tokenizer, alpha=0.0)

    # Execute
    ours = proxy.generate(PROMPTS, max_new_tokens=12, batch_size=3)
    reference = generate_texts(large_model, large_tokenizer, PROMPTS, max_new_tokens=12, batch_size=3)
    with evaluating(small):
        our_tokens = greedy(proxy.step_fn(), tokenizer)
    with evaluating(large_model):
        reference_tokens = greedy(model_step_fn(large_model), tokenizer)

    # Assert
    assert ours == reference
    assert torch.equal(our_tokens, reference_tokens)


@pytest.mark.parametrize("fuse_small", [True, False])
def test_kv_cached_decoding_equals_the_uncached_reference(fuse_small: bool) -> None:
    # Prepare
    small, tokenizer = tuned_small()
    proxy = ProxyTunedLM(large_source(), small, tokenizer, alpha=1.5, fuse_small=fuse_small)
    cached_logits: list[Tensor] = []
    uncached_logits: list[Tensor] = []

    # Execute
    with evaluating(small):
        cached = greedy(recorded(proxy.step_fn(), cached_logits), tokenizer, max_new_tokens=8)
        uncached = greedy(recorded(proxy.step_fn(cached=False), uncached_logits), tokenizer, max_new_tokens=8)

    # Assert
    assert torch.equal(cached, uncached)
    for ours, reference in zip(cached_logits, uncached_logits, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_fused_small_forward_equals_two_separate_forwards() -> None:
    # Prepare
    small, tokenizer = tuned_small()
    large = large_source()
    fused = ProxyTunedLM(large, small, tokenizer, alpha=2.0, fuse_small=True)
    separate = ProxyTunedLM(large, small, tokenizer, alpha=2.0, fuse_small=False)
    fused_logits: list[Tensor] = []
    separate_logits: list[Tensor] = []

    # Execute
    with evaluating(small):
        fused_tokens = greedy(recorded(fused.step_fn(), fused_logits), tokenizer)
        separate_tokens = greedy(recorded(separate.step_fn(), separate_logits), tokenizer)

    # Assert
    assert torch.equal(fused_tokens, separate_tokens)
    for ours, reference in zip(fused_logits, separate_logits, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_alpha_one_with_the_base_small_model_as_large_gives_the_tuned_output() -> None:
    # Prepare: z_base + 1 * (z_tuned - z_base) = z_tuned
    small, tokenizer = tuned_small()
    base_copy, _ = untied(SMALL, 0)
    proxy = ProxyTunedLM(LocalLogitSource(base_copy, tokenizer), small, tokenizer, alpha=1.0)

    # Execute
    ours = proxy.generate(PROMPTS, max_new_tokens=12, batch_size=5)
    tuned = generate_texts(small, tokenizer, PROMPTS, max_new_tokens=12, batch_size=5)
    with small.disable_adapter():
        base = generate_texts(small, tokenizer, PROMPTS, max_new_tokens=12, batch_size=5)

    # Assert
    assert tuned != base, "the adapter must change the output for this test to mean anything"
    assert ours == tuned


def test_sampling_with_a_seed_is_reproducible() -> None:
    small, tokenizer = tuned_small()
    proxy = ProxyTunedLM(large_source(), small, tokenizer, alpha=1.0)

    def sample(seed: int) -> list[str]:
        return proxy.generate(PROMPTS, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=seed, batch_size=3)

    first = sample(seed=3)
    assert sample(seed=3) == first
    assert sample(seed=4) != first


def test_decoding_stops_at_the_large_models_eos() -> None:
    # Prepare
    small, tokenizer = tuned_small()
    script = tokenizer("ok!")["input_ids"]
    proxy = ProxyTunedLM(ScriptedSource(script, tokenizer), small, tokenizer, alpha=1.0)

    # Execute
    with evaluating(small):
        tokens = greedy(proxy.step_fn(), tokenizer, max_new_tokens=20, eos=proxy.eos_token_ids())
        texts = proxy.generate(PROMPTS[:2], max_new_tokens=20)

    # Assert
    assert texts == ["ok!", "ok!"]
    assert tokens.shape[1] == len(script) + 1
    assert tokens[:, -1].tolist() == [tokenizer.eos_token_id] * len(PROMPTS)


def test_labelled_logits_are_the_decoding_logits_at_labelled_positions() -> None:
    # Prepare: the first 4 tokens are the prompt, the rest is labelled
    small, tokenizer = tuned_small()
    large = large_source()
    proxy = ProxyTunedLM(large, small, tokenizer, alpha=1.3)
    input_ids = torch.tensor([tokenizer("abcdefgh")["input_ids"]])
    labels = input_ids.clone()
    labels[:, :4] = -100
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}

    # Execute
    logits = proxy.labelled_logits(batch)
    with evaluating(small):
        expected = [
            proxy.step_fn()(prefix, torch.ones_like(prefix), torch.arange(prefix.shape[1])[None])[0]
            for prefix in (input_ids[:, : t + 1] for t in range(3, input_ids.shape[1] - 1))
        ]

    # Assert
    assert logits.shape == (input_ids.shape[1] - 4, proxy.vocab_width)
    torch.testing.assert_close(logits, torch.stack(expected), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(proxy.labelled_logits(batch, alpha=0.0), large.labelled_logits(batch))


def test_proxy_model_is_a_logit_source_and_needs_eval_mode() -> None:
    small, tokenizer = tuned_small()
    proxy = ProxyTunedLM(large_source(), small, tokenizer, alpha=1.0, vocab_width=100)

    assert isinstance(proxy, LogitSource) and proxy.vocab_width == 100
    assert proxy.eos_token_ids() == [tokenizer.eos_token_id]
    small.train()
    with pytest.raises(RuntimeError, match="training mode"):
        proxy.step_fn()
    with pytest.raises(ValueError, match="vocab_width"):
        ProxyTunedLM(large_source(), small, tokenizer, alpha=1.0, vocab_width=10_000)


# ---- a finished FedPT run ----


def fedpt_run(tmp_path: Path, proxy_json: dict[str, Any] | None, algorithm: str = "fedpt") -> Path:
    """A run directory as FedPT leaves it: config, final adapter and (optionally) proxy.json."""
    fedpt = [f"fedpt.large_model={LARGE}", "fedpt.alpha=1.7"] if algorithm == "fedpt" else []
    cfg = load_config(TINY_CONFIG, [f"algorithm={algorithm}", *fedpt])
    dump_config(cfg, tmp_path / "config.yaml")
    model, _ = load_causal_lm(cfg.model.name, seed=cfg.seed)
    attach_lora(model, r=4, alpha=8, dropout=0.0).save_pretrained(tmp_path / "artifacts" / "adapter")
    if proxy_json is not None:
        (tmp_path / "artifacts" / "proxy.json").write_text(json.dumps(proxy_json))
    return tmp_path


def test_load_proxy_model_takes_alpha_from_the_argument_then_proxy_json_then_config(tmp_path: Path) -> None:
    run_dir = fedpt_run(tmp_path, {"alpha": 1.3, "large_model": LARGE})

    proxy, cfg = load_proxy_model(run_dir)

    assert proxy.alpha == 1.3 and proxy.large.name == LARGE and cfg.fedpt.alpha == 1.7
    assert load_proxy_model(run_dir, alpha=2.0)[0].alpha == 2.0
    (run_dir / "artifacts" / "proxy.json").unlink()
    assert load_proxy_model(run_dir)[0].alpha == 1.7


def test_load_proxy_model_rejects_a_proxy_json_for_another_large_model(tmp_path: Path) -> None:
    run_dir = fedpt_run(tmp_path, {"alpha": 1.3, "large_model": "tiny-qwen2"})

    with pytest.raises(FinalModelError, match="tiny-qwen2"):
        load_proxy_model(run_dir)


def test_generate_from_a_fedpt_run_uses_the_proxy_model(tmp_path: Path, monkeypatch: Any) -> None:
    # Prepare: the run directory of `fedpt_run` with only the algorithm name switched, so no FedPT training.
    run_dir = fedpt_run(tmp_path, {"alpha": 1.3, "large_model": LARGE})
    proxy, _ = load_proxy_model(run_dir)

    # Execute
    texts = artifacts.generate_from_run(run_dir, ["hi"], max_new_tokens=6, raw=True, options={"alpha": "0.5"})
    small = artifacts.generate_from_run(run_dir, ["hi"], max_new_tokens=6, raw=True, variant="small")

    # Assert
    assert texts == proxy.generate(["hi"], max_new_tokens=6, alpha=0.5)
    assert small == generate_texts(proxy.small, proxy.tokenizer, ["hi"], max_new_tokens=6)
    with pytest.raises(FinalModelError, match="alpha applies to the proxy-tuned model"):
        artifacts.generate_from_run(run_dir, ["hi"], variant="small", options={"alpha": "1"})
    with pytest.raises(FinalModelError, match="not a number"):
        artifacts.generate_from_run(run_dir, ["hi"], options={"alpha": "high"})


def test_generate_from_a_non_fedpt_run_rejects_alpha(tmp_path: Path) -> None:
    run_dir = fedpt_run(tmp_path, None, algorithm="fedit")

    with pytest.raises(FinalModelError, match="no option alpha: it takes none"):
        artifacts.generate_from_run(run_dir, ["hi"], max_new_tokens=2, options={"alpha": "1.0"})
    with pytest.raises(FinalModelError, match="no final-model variant 'proxy'"):
        artifacts.generate_from_run(run_dir, ["hi"], max_new_tokens=2, variant="proxy")


def test_load_proxy_model_loads_both_models_from_the_runs_cache_dir_and_gguf_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from fedtune.models import loading

    run_dir = fedpt_run(tmp_path, None)
    cfg = load_run_config(run_dir)
    cfg.model.cache_dir = str(tmp_path / "cache")
    cfg.model.gguf_file = "small.gguf"
    monkeypatch.setattr(fedpt, "load_run_config", lambda _: cfg)
    calls: list[tuple[str, Any, Any]] = []
    real = loading.load_causal_lm

    def spy(name: str, **kwargs: Any) -> Any:
        calls.append((name, kwargs.get("cache_dir"), kwargs.get("gguf_file")))
        return real(name, seed=kwargs.get("seed", 0))

    monkeypatch.setattr(loading, "load_causal_lm", spy)
    load_proxy_model(run_dir)

    assert calls == [
        (cfg.model.name, tmp_path / "cache", "small.gguf"),
        (LARGE, tmp_path / "cache", None),
    ]
