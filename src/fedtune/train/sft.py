"""Local supervised fine-tuning of whatever is trainable in a model, for one round."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch

from fedtune.data.tokenize import Example, make_batches
from fedtune.train.loop import (
    Batch,
    FP32Master,
    LossFn,
    Reporter,
    TrainResult,
    sft_loss,
    steps_for,
    train_local,
)
from fedtune.train.optim import build_optimizer, build_scheduler


class SFTSettings(Protocol):
    """What a round of local SFT reads: plain values (a run config's ``train:`` section is one)."""

    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def betas(self) -> tuple[float, float]: ...
    @property
    def momentum(self) -> float: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def grad_accum(self) -> int: ...
    @property
    def local_epochs(self) -> float: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def schedule(self) -> str: ...
    @property
    def schedule_scope(self) -> str: ...
    @property
    def warmup_ratio(self) -> float: ...
    @property
    def min_lr_ratio(self) -> float: ...
    @property
    def clip_norm(self) -> float | None: ...
    @property
    def gradient_checkpointing(self) -> bool: ...


def local_sft(
    model: torch.nn.Module,
    examples: Sequence[Example],
    train: SFTSettings,
    *,
    pad_token_id: int,
    seed: int,
    rnd: int,
    rounds: int,
    bucketing: bool = True,
    prox_mu: float = 0.0,
    report: Reporter | None = None,
    trainable: Mapping[str, torch.nn.Parameter] | None = None,
    grad_masks: Mapping[str, torch.Tensor] | None = None,
    batches: Sequence[Batch] | None = None,
    loss_fn: LossFn = sft_loss,
) -> TrainResult:
    """``train.local_epochs`` epochs (or ``train.max_steps``) of SFT with a fresh optimizer.

    ``trainable`` selects what trains (LoRA, whole layers, a head, any mix; default: whatever
    already requires grad); the flags are restored afterwards. ``grad_masks`` (keyed by
    ``model.named_parameters()`` names) limits training to chosen entries (``train_local``);
    ``prox_mu`` adds the proximal term towards the starting point.
    ``seed`` fixes the batch order and every random op (dropout), so a resumed run repeats the
    exact same steps.

    ``batches`` replaces the batches built from ``examples``: the round's own, one shuffle per started
    epoch (``epochs_started``), e.g. with extra tensors a custom ``loss_fn`` reads (FedMKT's teachers).
    """
    if batches is None and not examples:
        raise ValueError("local_sft: this client has no training examples")
    with only_trainable(model, trainable):
        torch.manual_seed(seed)
        if batches is None:
            batches, steps = _round_batches(examples, train, pad_token_id, seed, bucketing)
        else:
            per_epoch = len(batches) // epochs_started(train.local_epochs)
            steps = steps_for(per_epoch, train.local_epochs, train.grad_accum, train.max_steps)
        # A half-precision model trains its selected full layers through fp32 master copies.
        master = FP32Master.needed({n: p for n, p in model.named_parameters() if p.requires_grad})
        optimizer = build_optimizer(
            model.parameters() if master is None else master.optimizer_parameters(),
            train.optimizer,
            lr=train.lr,
            weight_decay=train.weight_decay,
            betas=train.betas,
            momentum=train.momentum,
        )
        scheduler = build_scheduler(
            optimizer,
            train.schedule,
            steps_this_round=steps,
            rnd=rnd,
            rounds=rounds,
            scope=train.schedule_scope,
            warmup_ratio=train.warmup_ratio,
            min_ratio=train.min_lr_ratio,
        )
        reference = (
            {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
            if prox_mu > 0
            else None
        )
        return train_local(
            model,
            batches,
            optimizer,
            scheduler,
            steps=steps,
            grad_accum=train.grad_accum,
            clip_norm=train.clip_norm,
            prox_mu=prox_mu,
            prox_reference=reference,
            report=report,
            grad_masks=grad_masks,
            master=master,
            loss_fn=loss_fn,
            gradient_checkpointing=train.gradient_checkpointing,
        )


def _round_batches(
    examples: Sequence[Example], train: SFTSettings, pad_token_id: int, seed: int, bucketing: bool
) -> tuple[list[dict[str, torch.Tensor]], int]:
    """The round's batches (one shuffle per started epoch) and its number of optimizer steps."""
    epochs = epochs_started(train.local_epochs)
    batches = [
        batch
        for epoch in range(epochs)
        for batch in make_batches(
            examples, train.batch_size, pad_token_id, seed=seed + epoch, bucketing=bucketing
        )
    ]
    per_epoch = len(batches) // epochs
    return batches, steps_for(per_epoch, train.local_epochs, train.grad_accum, train.max_steps)


def epochs_started(local_epochs: float) -> int:
    """Epochs a round starts (1.5 epochs start 2), each with its own shuffle."""
    return max(1, int(-(-local_epochs // 1)))


@contextmanager
def only_trainable(model: torch.nn.Module, params: Mapping[str, torch.nn.Parameter] | None) -> Iterator[None]:
    """Exactly ``params`` require grad inside the block (None: leave the model as it is)."""
    if params is None:
        yield
        return
    before = [(p, p.requires_grad) for p in model.parameters()]
    chosen = {id(p) for p in params.values()}
    for p, _ in before:
        p.requires_grad_(id(p) in chosen)
    try:
        yield
    finally:
        for p, flag in before:
            p.requires_grad_(flag)
