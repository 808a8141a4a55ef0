"""Prompt templates: the papers' Alpaca wrapper and the model's own chat template.

A template turns a record into ``(prompt, response)``; training labels only the response.
"""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedTokenizerBase

from fedtune.data.records import Record

TemplateName = Literal["alpaca", "chat", "plain"]

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def alpaca_prompt(record: Record) -> str:
    if record.input:
        return ALPACA_WITH_INPUT.format(instruction=record.instruction, input=record.input)
    return ALPACA_NO_INPUT.format(instruction=record.instruction)


def plain_prompt(record: Record) -> str:
    """Instruction (and input) then a newline: for classification-style data and encoders."""
    return f"{record.instruction}\n{record.input}\n" if record.input else f"{record.instruction}\n"


def chat_prompt(record: Record, tokenizer: PreTrainedTokenizerBase) -> str:
    if not tokenizer.chat_template:
        raise ValueError("template 'chat' needs a tokenizer with a chat template; use template: alpaca")
    content = f"{record.instruction}\n\n{record.input}" if record.input else record.instruction
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str)
    return prompt


def build_prompt(
    record: Record, template: TemplateName, tokenizer: PreTrainedTokenizerBase | None = None
) -> str:
    """The prompt text the model sees before the response."""
    if template == "alpaca":
        return alpaca_prompt(record)
    if template == "plain":
        return plain_prompt(record)
    if template == "chat":
        if tokenizer is None:
            raise ValueError("template 'chat' needs a tokenizer")
        return chat_prompt(record, tokenizer)
    raise ValueError(f"unknown template {template!r}; choose alpaca, chat or plain")
