"""Sequence classification data: class names, encoded examples, batches, the loss and the metrics.

A record is classified from its ``instruction`` alone (single-sentence tasks, like SST-2) or from the
pair (``instruction``, ``input``) when ``input`` is set (sentence-pair tasks, like QNLI/MNLI): the pair
goes through the tokenizer as two segments (``[CLS] a [SEP] b [SEP]`` for BERT). The class of a
record is its ``label`` when it has ``choices`` (multiple-choice records: the class names are the
choices), else the index of its ``output`` among the class names.

Segment ids (``token_type_ids``) travel with the token ids whenever the tokenizer returns them (BERT
and its family): the encoder adds a token-type embedding per segment, so without them the second
segment would be embedded as the first. Batches then carry ``token_type_ids`` [B, T] and every
forward here passes them on (`model_inputs`); tokenizers without them (decoders) add nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from fedtune.data.records import DataError, Record

Batch = dict[str, Tensor]
CLASS_LABELS = "class_labels"
"""The batch key of the class ids [B] (``labels`` would make transformers compute its own loss)."""
TOKEN_TYPES = "token_type_ids"
"""The batch key of the segment ids [B, T], present when the tokenizer gives them."""


@dataclass(frozen=True)
class ClassExample:
    input_ids: list[int]
    label: int
    token_type_ids: list[int] | None = None
    """Segment ids (0: first segment, 1: second), when the tokenizer gives them; as long as input_ids."""


def class_names(dataset: str, records: Sequence[Record], names: Sequence[str] | None = None) -> list[str]:
    """The class names of ``dataset``: ``names`` when given, else the records' ``choices`` (all equal),
    else the built-in dataset's ``categories``.

    Every role derives the same list from the config, so class ids agree between server and clients.
    """
    if names:
        return list(names)
    with_choices = [rec.choices for rec in records if rec.choices]
    if with_choices:
        first = list(with_choices[0])
        if any(list(choices) != first for choices in with_choices):
            raise DataError(f"{dataset}: records offer different choices; set the class names explicitly")
        return first
    from fedtune.data.builtin import builtin_info, list_builtin

    if dataset in {info.name for info in list_builtin()}:
        info = builtin_info(dataset)
        if info.task == "classification" and info.categories:
            return list(info.categories)
    raise DataError(
        f"{dataset}: cannot tell the class names (no choices, not a built-in classification set); "
        "list them under the algorithm's 'labels' key"
    )


def class_id(record: Record, names: Sequence[str]) -> int:
    """The class of ``record`` (its ``label`` for choice records, else its ``output``'s position)."""
    if record.choices:
        if not 0 <= record.label < len(names):
            raise DataError(
                f"record {record.id}: label {record.label} is not a class id (0..{len(names) - 1})"
            )
        return int(record.label)
    try:
        return list(names).index(record.output)
    except ValueError:
        raise DataError(
            f"record {record.id}: output {record.output!r} is not one of the {len(names)} class names"
        ) from None


def encode_segments(
    record: Record, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> tuple[list[int], list[int] | None]:
    """Token ids of what is classified (one segment, or two for pair records; truncated to
    ``max_length``) and their segment ids, or None when the tokenizer gives none."""
    second = record.input or None
    encoded = tokenizer(record.instruction, second, truncation=True, max_length=max_length)
    types = encoded.get("token_type_ids")
    return list(encoded["input_ids"]), None if types is None else [int(t) for t in types]


def encode_text(record: Record, tokenizer: PreTrainedTokenizerBase, max_length: int) -> list[int]:
    """Token ids of what is classified (`encode_segments` without the segment ids)."""
    return encode_segments(record, tokenizer, max_length)[0]


def encode_example(
    record: Record, tokenizer: PreTrainedTokenizerBase, label: int, max_length: int
) -> ClassExample:
    """``record`` encoded (`encode_segments`) with class id ``label``."""
    ids, types = encode_segments(record, tokenizer, max_length)
    return ClassExample(ids, label, types)


def encode_classification(
    records: Sequence[Record], tokenizer: PreTrainedTokenizerBase, names: Sequence[str], max_length: int
) -> list[ClassExample]:
    """Token ids and segment ids (`encode_segments`) and class ids."""
    return [encode_example(rec, tokenizer, class_id(rec, names), max_length) for rec in records]


def collate_classification(examples: Sequence[ClassExample], pad_token_id: int) -> Batch:
    """Right-padded input_ids [B, T], attention_mask [B, T] and ``class_labels`` [B]; token_type_ids
    [B, T] (0 on padding) when the examples have segment ids (all of them or none)."""
    width = max(len(ex.input_ids) for ex in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    typed = [ex.token_type_ids is not None for ex in examples]
    if any(typed) and not all(typed):
        raise ValueError("a batch mixes examples with and without segment ids (token_type_ids)")
    token_types = torch.zeros((len(examples), width), dtype=torch.long) if all(typed) else None
    for row, ex in enumerate(examples):
        input_ids[row, : len(ex.input_ids)] = torch.tensor(ex.input_ids)
        attention_mask[row, : len(ex.input_ids)] = 1
        if token_types is not None and ex.token_type_ids is not None:
            if len(ex.token_type_ids) != len(ex.input_ids):
                raise ValueError("an example's token_type_ids and input_ids differ in length")
            token_types[row, : len(ex.token_type_ids)] = torch.tensor(ex.token_type_ids)
    labels = torch.tensor([ex.label for ex in examples], dtype=torch.long)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, CLASS_LABELS: labels}
    if token_types is not None:
        batch[TOKEN_TYPES] = token_types
    return batch


def classification_batches(
    examples: Sequence[ClassExample], batch_size: int, pad_token_id: int, *, seed: int | None, epochs: int = 1
) -> list[Batch]:
    """``epochs`` passes over ``examples`` in batches, each pass shuffled by ``seed + epoch`` (or in order
    with ``seed`` None)."""
    batches = []
    for epoch in range(epochs):
        order = np.arange(len(examples))
        if seed is not None:
            order = np.random.default_rng(seed + epoch).permutation(len(examples))
        for start in range(0, len(order), batch_size):
            chunk = [examples[int(i)] for i in order[start : start + batch_size]]
            batches.append(collate_classification(chunk, pad_token_id))
    return batches


def model_inputs(batch: Batch) -> Batch:
    """What a forward pass takes from ``batch``: input_ids, attention_mask and, when the batch has
    them, token_type_ids (never the labels)."""
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if TOKEN_TYPES in batch:
        inputs[TOKEN_TYPES] = batch[TOKEN_TYPES]
    return inputs


def class_logits(model: nn.Module, batch: Batch) -> Tensor:
    """[B, C] logits of a sequence classifier (segment ids passed on when the batch has them)."""
    logits: Tensor = model(**model_inputs(batch)).logits
    return logits


def classification_loss(model: nn.Module, batch: Batch) -> tuple[Tensor, int]:
    """Summed cross-entropy over the batch and its number of examples (a ``LossFn``)."""
    logits = class_logits(model, batch).float()
    labels = batch[CLASS_LABELS]
    return F.cross_entropy(logits, labels, reduction="sum"), int(labels.numel())


def macro_f1(predictions: Sequence[int], labels: Sequence[int], num_classes: int) -> float:
    """The unweighted mean of per-class F1 over the classes that occur in ``labels`` or ``predictions``."""
    pred, gold = np.asarray(predictions), np.asarray(labels)
    scores = []
    for cls in range(num_classes):
        tp = int(np.sum((pred == cls) & (gold == cls)))
        fp, fn = int(np.sum((pred == cls) & (gold != cls))), int(np.sum((pred != cls) & (gold == cls)))
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


@torch.no_grad()
def predict_classes(model: nn.Module, batches: Iterable[Batch]) -> tuple[list[int], list[int]]:
    """(predicted, true) class ids over ``batches``, the model in eval mode."""
    model.eval()
    device = next(model.parameters()).device
    predicted: list[int] = []
    gold: list[int] = []
    for batch in batches:
        on_device = {k: v.to(device) for k, v in batch.items()}
        predicted += class_logits(model, on_device).argmax(-1).tolist()
        gold += batch[CLASS_LABELS].tolist()
    return predicted, gold


def classification_metrics(
    predicted: Sequence[int], gold: Sequence[int], num_classes: int
) -> dict[str, float]:
    """``accuracy`` and ``macro_f1`` (in [0, 1])."""
    if not gold:
        raise ValueError("classification metrics of no examples")
    hits = np.asarray(predicted) == np.asarray(gold)
    return {"accuracy": float(hits.mean()), "macro_f1": macro_f1(predicted, gold, num_classes)}
