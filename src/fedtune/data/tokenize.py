"""Tokenization with response-only labels, padding collation and length bucketing."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from fedtune.data.records import Record
from fedtune.data.templates import TemplateName, build_prompt

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    """One tokenized example: ``labels`` is -100 on prompt tokens (loss on the response only)."""

    input_ids: list[int]
    labels: list[int]

    @property
    def num_target_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def encode_example(
    prompt: str, response: str, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> Example:
    """Prompt + response + EOS, truncated to ``max_length``.

    When too long, the prompt is cut from the left (its end, nearest the response, matters most)
    and the response from the right, keeping at least half the budget for the response.
    """
    prompt_ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response_ids.append(int(tokenizer.eos_token_id))
    overflow = len(prompt_ids) + len(response_ids) - max_length
    if overflow > 0:
        response_budget = max(max_length // 2, max_length - len(prompt_ids))
        response_ids = response_ids[:response_budget]
        prompt_ids = prompt_ids[max(0, len(prompt_ids) + len(response_ids) - max_length) :]
    return Example(prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids)


def encode_records(
    records: Sequence[Record],
    tokenizer: PreTrainedTokenizerBase,
    template: TemplateName,
    max_length: int,
) -> list[Example]:
    return [
        encode_example(build_prompt(rec, template, tokenizer), rec.output, tokenizer, max_length)
        for rec in records
    ]


def collate(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids [B, T], attention_mask [B, T], labels [B, T] (-100 on pads)."""
    width = max(len(ex.input_ids) for ex in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex.input_ids)
        input_ids[row, :n] = torch.tensor(ex.input_ids)
        labels[row, :n] = torch.tensor(ex.labels)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def batch_indices(
    lengths: Sequence[int], batch_size: int, *, seed: int, bucketing: bool, shuffle: bool = True
) -> list[list[int]]:
    """Index batches for one epoch.

    With bucketing, examples are shuffled, then sorted by length inside windows of 50 batches,
    so a batch holds similar lengths (little padding) while batch order stays random.
    """
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
    if bucketing:
        window = batch_size * 50
        order = [
            i
            for start in range(0, len(order), window)
            for i in sorted(order[start : start + window], key=lambda j: lengths[j])
        ]
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if bucketing and shuffle:
        rng.shuffle(batches)
    return batches


def make_batches(
    examples: Sequence[Example],
    batch_size: int,
    pad_token_id: int,
    *,
    seed: int,
    bucketing: bool = True,
    shuffle: bool = True,
) -> list[dict[str, torch.Tensor]]:
    lengths = [len(ex.input_ids) for ex in examples]
    return [
        collate([examples[i] for i in idx], pad_token_id)
        for idx in batch_indices(lengths, batch_size, seed=seed, bucketing=bucketing, shuffle=shuffle)
    ]
