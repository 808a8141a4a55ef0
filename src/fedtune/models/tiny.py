"""Tiny randomly initialised models and tokenizers, built offline in milliseconds.

Used by the unit and integration tests and by ``model.name: tiny-<arch>`` configs. Tokenizer
families (`TINY_TOKENIZERS`, chosen by a name suffix such as ``tiny-llama-spm``), all with the same
special tokens and chat template:
- ``byte`` (no suffix): 256 byte tokens + specials, no merges;
- ``bpe``: a GPT-2 style byte-level BPE (``Ġ`` marks a space) with merges learned on `TINY_CORPUS`;
- ``spm``: a SentencePiece style BPE (``▁`` marks a space, via Metaspace) with byte-fallback tokens
  ``<0x00>`` .. ``<0xFF>``, learned on the same corpus: other ids, another vocabulary size.
Training is deterministic (the ``tokenizers`` trainer breaks count ties by the pair itself).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

TINY_ARCHS = ("llama", "qwen2", "gpt2", "bert")
TINY_TOKENIZERS = ("byte", "bpe", "spm")
"""Tokenizer families; ``byte`` is the default and has no name suffix."""
SPECIAL_TOKENS = ("<|pad|>", "<|eos|>", "<|bos|>", "<|unk|>", "[CLS]", "[SEP]")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|bos|>{{ message['role'] }}\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


TINY_CORPUS = (
    "The cat sat on the mat, and the dog slept by the door.",
    "Define 'cat': a small domesticated carnivorous mammal with soft fur.",
    "Give a synonym of 'happy': glad. Give an antonym of 'happy': sad.",
    "What is the part of speech of 'quickly'? It is an adverb.",
    "Use the word 'river' in a sentence: The river runs to the sea.",
    "def add(a, b):\n    return a + b\n",
    "for item in items:\n    print(item)\n",
    "Tom has 3 apples and buys 12 more. How many apples does he have now? 15.",
    "Instruction: answer the question.\nResponse: the answer is in the text.",
    "There are many words in the dictionary, and every word has a meaning.",
)
"""The fixed text the ``bpe`` and ``spm`` families learn their merges from."""
_LEARNED_SIZES = {"bpe": 400, "spm": 200}


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
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


def _byte_tokenizer() -> Tokenizer:
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _learned(family: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges learned on `TINY_CORPUS` by a pipeline of ``family``."""
    pre_tokenizer: pre_tokenizers.PreTokenizer
    if family == "bpe":
        pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = []
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=_LEARNED_SIZES[family], initial_alphabet=alphabet, show_progress=False
    )
    learner.train_from_iterator(TINY_CORPUS, trainer)
    model = json.loads(learner.to_str())["model"]
    return model["vocab"], [tuple(pair) for pair in model["merges"]]


@cache
def _pipeline_json(family: str) -> str:
    """The serialised tokenizer of ``family`` (built once per process, copied for every caller)."""
    if family == "byte":
        return _byte_tokenizer().to_str()
    learned, merges = _learned(family)
    # Specials first (their own ids), then SentencePiece's byte tokens, then the learned pieces.
    pieces = [*SPECIAL_TOKENS, *([f"<0x{b:02X}>" for b in range(256)] if family == "spm" else [])]
    pieces += [piece for piece, _ in sorted(learned.items(), key=lambda item: item[1])]
    vocab = {piece: index for index, piece in enumerate(dict.fromkeys(pieces))}
    if family == "bpe":
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<|unk|>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<|unk|>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    return tok.to_str()


def tiny_tokenizer(family: str = "byte") -> PreTrainedTokenizerFast:
    """A tokenizer of one of `TINY_TOKENIZERS` (module docstring), no files involved."""
    if family not in TINY_TOKENIZERS:
        raise ValueError(f"unknown tiny tokenizer {family!r}; choose one of {', '.join(TINY_TOKENIZERS)}")
    return _wrap(Tokenizer.from_str(_pipeline_json(family)))


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
    classifier: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised model of the given family with ``tokenizer`` (default: the byte-level one):
    a sequence classifier with ``num_labels`` classes for BERT or with ``classifier``, else a causal LM."""
    tok = tokenizer or tiny_tokenizer()
    config = _tiny_config(arch, len(tok), num_layers, hidden, num_labels)
    config.pad_token_id = tok.pad_token_id
    config.eos_token_id = tok.eos_token_id
    config.bos_token_id = tok.bos_token_id
    torch.manual_seed(seed)
    model: PreTrainedModel
    if arch == "bert" or classifier:
        config.num_labels = num_labels
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval(), tok
