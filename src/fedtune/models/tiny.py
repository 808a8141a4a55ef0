"""Tiny randomly initialised models and a byte-level tokenizer, built offline in milliseconds.

Used by the unit and integration tests and by ``model.name: tiny-<arch>`` configs.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

TINY_ARCHS = ("llama", "qwen2", "gpt2", "bert")
SPECIAL_TOKENS = ("<|pad|>", "<|eos|>", "<|bos|>", "<|unk|>", "[CLS]", "[SEP]")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|bos|>{{ message['role'] }}\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens + specials, no merges, no files."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|eos|>",
        bos_token="<|bos|>",
        unk_token="<|unk|>",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _tiny_config(arch: str, vocab_size: int, num_layers: int, hidden: int, num_labels: int) -> Any:
    heads = max(1, hidden // 16)
    if arch in ("llama", "qwen2"):
        return AutoConfig.for_model(
            arch,
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=1024,
            tie_word_embeddings=arch == "llama",
        )
    if arch == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            vocab_size=vocab_size,
            n_embd=hidden,
            n_layer=num_layers,
            n_head=heads,
            n_positions=1024,
            bos_token_id=None,
            eos_token_id=None,
        )
    if arch == "bert":
        return AutoConfig.for_model(
            "bert",
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=hidden * 4,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            max_position_embeddings=512,
            num_labels=num_labels,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")


def tiny_model(
    arch: str = "llama",
    *,
    num_layers: int = 2,
    hidden: int = 32,
    num_labels: int = 2,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised model of the given family with the byte-level tokenizer."""
    tok = tokenizer or tiny_tokenizer()
    config = _tiny_config(arch, len(tok), num_layers, hidden, num_labels)
    config.pad_token_id = tok.pad_token_id
    config.eos_token_id = tok.eos_token_id
    config.bos_token_id = tok.bos_token_id
    torch.manual_seed(seed)
    model: PreTrainedModel
    if arch == "bert":
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval(), tok
