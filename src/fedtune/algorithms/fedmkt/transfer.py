"""FedMKT's maths as pure functions: top-k knowledge, DualMinCE (Alg. 2), the mixed loss, and moving
knowledge between tokenizations (each party's view of the public set, the alignment of a sender's
top-k onto a receiver's tokens through ``fedtune.align``, the receiver's KD batches).

Shapes: ``N`` positions (response tokens, row-major over a batch), ``V`` the student's vocabulary,
``k`` the number of teacher entries per position, ``T_i`` / ``R_i`` the sender's / receiver's response
tokens of public sample i. Teacher rows are padded with id -1 and value -inf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from fedtune.algorithms.fedmkt.wire import Knowledge
from fedtune.align import one_to_one, project_topk, token_strings
from fedtune.data.records import Record
from fedtune.data.templates import TemplateName
from fedtune.data.tokenize import IGNORE_INDEX, Example, batch_indices, collate, encode_records
from fedtune.train.loop import LossFn
from fedtune.train.losses import labelled_logits
from fedtune.train.sft import SFTSettings, epochs_started

NOT_SELECTED = -1


def dual_min_ce(client_losses: np.ndarray, local_loss: np.ndarray) -> np.ndarray:
    """Alg. 2 (DualMinCE): for each public sample the teacher k* = argmin_k l_k^i, kept only if its
    loss is below the learner's own (``l_k*^i < l_local^i``).

    ``client_losses``: [K, N] each teacher's per-sample loss; ``local_loss``: [N]. Returns [N] int64:
    k* (ties: the lowest k) or ``NOT_SELECTED``. With one teacher (K = 1) it is the clients' rule
    "keep i if the LLM's loss is below mine".
    """
    losses = np.asarray(client_losses, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] != len(local_loss):
        raise ValueError(f"client_losses must be [K, {len(local_loss)}], got {losses.shape}")
    best = np.argmin(losses, axis=0)
    best_loss = losses[best, np.arange(losses.shape[1])]
    return np.where(best_loss < np.asarray(local_loss, dtype=np.float64), best, NOT_SELECTED).astype(np.int64)


def soft_target_ce(student_logits: Tensor, teacher_ids: Tensor, teacher_values: Tensor) -> Tensor:
    """Per-row cross-entropy of the student against a sparse teacher: ``-sum_j p_t(j) log p_s(j)``.

    ``student_logits``: [N, V]; ``teacher_ids`` [N, k] (-1 = padding); ``teacher_values`` [N, k]
    teacher logits (-inf on padding): the teacher distribution is their softmax over the row's
    entries (a one-hot row has a single entry). Returns [N].
    """
    valid = teacher_ids >= 0
    if not bool(valid.any(dim=-1).all()):
        raise ValueError("soft_target_ce: a teacher row has no entry")
    if int(teacher_ids.max()) >= student_logits.shape[-1]:
        raise ValueError(
            f"teacher id {int(teacher_ids.max())} is outside the student's {student_logits.shape[-1]} logits"
        )
    values = teacher_values.float().masked_fill(~valid, float("-inf"))
    teacher = torch.softmax(values, dim=-1)
    log_student = F.log_softmax(student_logits.float(), dim=-1)
    picked = log_student.gather(-1, teacher_ids.clamp_min(0))
    return -(teacher * picked.masked_fill(~valid, 0.0)).sum(dim=-1)


def mixed_loss(
    student_logits: Tensor,
    targets: Tensor,
    teacher_ids: Tensor,
    teacher_values: Tensor,
    selected: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``lam * CE + (1 - lam) * KD`` summed over N positions (the loop divides by the token count).

    CE is the next-token cross-entropy on every position; KD (``soft_target_ce``) only on the
    ``selected`` [N] positions (those of samples DualMinCE kept). Returns (loss, ce, kd), all sums.
    """
    ce = F.cross_entropy(student_logits.float(), targets, reduction="sum")
    if bool(selected.any()):
        kd = soft_target_ce(student_logits[selected], teacher_ids[selected], teacher_values[selected]).sum()
    else:
        kd = ce.new_zeros(())
    return lam * ce + (1.0 - lam) * kd, ce.detach(), kd.detach()


def mixed_loss_fn(lam: float, stats: dict[str, float]) -> LossFn:
    """A ``train_local`` loss: ``mixed_loss`` on a KD batch (``kd_collate``); adds CE/KD sums to ``stats``."""

    def loss(model: torch.nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, int]:
        logits, targets = labelled_logits(model, batch)
        mask = batch["labels"][:, 1:] != -100
        ids = batch["teacher_ids"][:, 1:][mask]
        values = batch["teacher_values"][:, 1:][mask]
        selected = batch["selected"][:, None].expand_as(mask)[mask] & (ids[:, 0] >= 0)
        total, ce, kd = mixed_loss(logits, targets, ids, values, selected, lam)
        stats["ce"] = stats.get("ce", 0.0) + float(ce)
        stats["kd"] = stats.get("kd", 0.0) + float(kd)
        stats["kd_tokens"] = stats.get("kd_tokens", 0.0) + float(selected.sum())
        return total, int(targets.numel())

    return loss


@torch.no_grad()
def public_knowledge(
    model: torch.nn.Module, batches: Sequence[Mapping[str, Tensor]], top_k: int, vocab_size: int
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Per-sample loss and per-position top-k on the public set, batches in sample order.

    Returns ``losses`` [N] (mean CE over each sample's response tokens), and per sample ``ids`` and
    ``values`` [T_i, top_k]: the top-k logits of the distribution that predicts each response token,
    among the tokenizer's ``vocab_size`` ids (a model's padded embedding rows name no token).
    """
    device = next(model.parameters()).device
    losses: list[float] = []
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    model.eval()
    for batch in batches:
        batch = {key: value.to(device) for key, value in batch.items()}
        logits, targets = labelled_logits(model, batch)
        logits = logits.float()
        token_ce = F.cross_entropy(logits, targets, reduction="none")
        top_values, top_ids = logits[:, :vocab_size].topk(top_k, dim=-1)
        counts = (batch["labels"][:, 1:] != -100).sum(dim=1).tolist()
        start = 0
        for count in counts:
            if count == 0:
                raise ValueError("a public example has no response token left after truncation")
            losses.append(float(token_ce[start : start + count].mean()))
            ids.append(top_ids[start : start + count].cpu().numpy())
            values.append(top_values[start : start + count].cpu().numpy())
            start += count
    return np.asarray(losses, dtype=np.float32), ids, values


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
    """``records`` as ``tokenizer`` sees them: examples, token strings, and response positions [T_i]."""
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


def selected_teachers(
    choice: np.ndarray, rows: Sequence[Sequence[Teacher]], counts: Sequence[int]
) -> list[Teacher]:
    """Per public sample i the rows of the teacher DualMinCE chose (``choice`` [N]; ``rows[k][i]``:
    teacher k's rows on the receiver's R_i = ``counts[i]`` response tokens, [R_i, k]), or, where it
    chose none, an empty row per token ([R_i, 1]: id -1, value -inf)."""
    teachers: list[Teacher] = []
    for sample, chosen in enumerate(choice):
        if chosen == NOT_SELECTED:
            positions = counts[sample]
            teachers.append(
                (
                    np.full((positions, 1), -1, dtype=np.int64),
                    np.full((positions, 1), -np.inf, dtype=np.float32),
                )
            )
        else:
            teachers.append(rows[chosen][sample])
    return teachers
