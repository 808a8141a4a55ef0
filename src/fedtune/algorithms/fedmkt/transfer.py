"""Moving knowledge between tokenizations: each party's view of the public set, the alignment of a
sender's top-k onto a receiver's tokens (``fedtune.align``), and the receiver's KD batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from fedtune.algorithms.fedmkt.wire import Knowledge
from fedtune.align import one_to_one, project_topk, token_strings
from fedtune.data.records import Record
from fedtune.data.templates import TemplateName
from fedtune.data.tokenize import IGNORE_INDEX, Example, batch_indices, collate, encode_records
from fedtune.train.sft import SFTSettings, epochs_started

Teacher = tuple[np.ndarray, np.ndarray]
"""One sample's teacher rows on the receiver's response tokens: ids [R_i, k] (-1 pad), values [R_i, k]."""


@dataclass(frozen=True)
class PublicView:
    """One tokenizer's view of the public set: examples, normalized token strings, response positions."""

    examples: list[Example]
    strings: list[list[str]]
    positions: list[np.ndarray]

    @property
    def counts(self) -> list[int]:
        return [len(p) for p in self.positions]


def public_view(
    records: Sequence[Record], tokenizer: PreTrainedTokenizerBase, template: TemplateName, max_length: int
) -> PublicView:
    examples = encode_records(records, tokenizer, template, max_length)
    strings = [token_strings(tokenizer, ex.input_ids) for ex in examples]
    positions = [np.flatnonzero(np.asarray(ex.labels) != IGNORE_INDEX) for ex in examples]
    return PublicView(examples, strings, positions)


def alignments(sender: PublicView, receiver: PublicView) -> list[np.ndarray]:
    """Per sample and receiver token, the sender's response position matched 1:1 with it, else -1."""
    matches = []
    for s_ex, _r_ex, s_str, r_str, s_pos in zip(
        sender.examples, receiver.examples, sender.strings, receiver.strings, sender.positions, strict=True
    ):
        match = np.arange(len(r_str), dtype=np.int64) if s_str == r_str else one_to_one(s_str, r_str)
        labelled = np.zeros(len(s_ex.input_ids), dtype=bool)
        labelled[s_pos] = True
        matches.append(np.where((match >= 0) & labelled[match.clip(0)], match, -1))
    return matches


def teacher_rows(
    knowledge: Knowledge,
    sender: PublicView,
    receiver: PublicView,
    matches: Sequence[np.ndarray],
    vocab_map: np.ndarray,
) -> list[Teacher]:
    """The sender's top-k on every response token of the receiver (App. B): 1:1-matched tokens get
    the sender's ids through the vocabulary map (first assignment wins), the others a one-hot on
    the receiver's own token."""
    rows = []
    for sample, match in enumerate(matches):
        length = len(sender.examples[sample].input_ids)
        k = knowledge.ids[sample].shape[1]
        full_ids = np.full((length, k), -1, dtype=np.int64)
        full_values = np.full((length, k), -np.inf, dtype=np.float32)
        full_ids[sender.positions[sample]] = knowledge.ids[sample]
        full_values[sender.positions[sample]] = knowledge.values[sample]
        target = np.asarray(receiver.examples[sample].input_ids, dtype=np.int64)
        ids, values = project_topk(full_ids, full_values, match, vocab_map, target)
        wanted = receiver.positions[sample]
        rows.append((ids[wanted], values[wanted]))
    return rows


def kd_collate(
    examples: Sequence[Example], teachers: Sequence[Teacher], selected: Sequence[bool], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """``collate`` plus ``teacher_ids``/``teacher_values`` [B, T, k] on the response positions and
    ``selected`` [B] (whether DualMinCE kept the sample for KD)."""
    batch = collate(examples, pad_token_id)
    width = batch["input_ids"].shape[1]
    k = max(t[0].shape[1] for t in teachers)
    ids = torch.full((len(examples), width, k), -1, dtype=torch.long)
    values = torch.full((len(examples), width, k), float("-inf"))
    for row, (example, (t_ids, t_values)) in enumerate(zip(examples, teachers, strict=True)):
        positions = torch.from_numpy(np.flatnonzero(np.asarray(example.labels) != IGNORE_INDEX))
        ids[row, positions, : t_ids.shape[1]] = torch.from_numpy(t_ids)
        values[row, positions, : t_values.shape[1]] = torch.from_numpy(t_values)
    batch.update(teacher_ids=ids, teacher_values=values, selected=torch.tensor(list(selected)))
    return batch


def kd_batches(
    examples: Sequence[Example],
    teachers: Sequence[Teacher],
    selected: np.ndarray,
    train: SFTSettings,
    pad_token_id: int,
    *,
    seed: int,
) -> list[dict[str, torch.Tensor]]:
    """Shuffled, length-bucketed KD batches of the public set at ``train.batch_size``, one shuffle per
    epoch ``train.local_epochs`` starts (what ``local_sft`` expects of prebuilt batches)."""
    lengths = [len(ex.input_ids) for ex in examples]
    return [
        kd_collate(
            [examples[i] for i in idx],
            [teachers[i] for i in idx],
            [bool(selected[i]) for i in idx],
            pad_token_id,
        )
        for epoch in range(epochs_started(train.local_epochs))
        for idx in batch_indices(lengths, train.batch_size, seed=seed + epoch, bucketing=True)
    ]
