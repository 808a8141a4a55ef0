"""What a HetLoRA client runs: LoRA fine-tuning at its rank with the self-pruning regulariser.

The local loss is the SFT loss plus ``reg_weight`` x the tail norm (``maths.tail_penalty``) of the
client's rank, so the tail shrinks where the data does not need it. The client keeps nothing between
rounds: its rank is the shape it was sent, and the server applies the pruning rule to its reply.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedtune.algorithms.adapters import ADAPTER
from fedtune.algorithms.hetlora.config import HetLoRAConfig
from fedtune.algorithms.hetlora.maths import tail_penalty, tail_start
from fedtune.algorithms.hetrank.client import LossFor, train_at_rank
from fedtune.algorithms.hetrank.maths import lora_pairs, truncate
from fedtune.algorithms.local import fit_scalars
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.train.loop import Batch, LossFn, sft_loss


def regularised_loss(section: HetLoRAConfig) -> LossFor:
    """The ``LossFor`` of HetLoRA: SFT plus lambda x the tail norm of the client's rank."""

    def loss_for(params: Mapping[str, torch.nn.Parameter], rank: int) -> LossFn:
        start = tail_start(rank, section.gamma, section.min_rank)
        pairs = [(params[a], params[b]) for a, b in lora_pairs(list(params)).values()]
        if section.reg_weight == 0 or start >= rank:
            return sft_loss

        def loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
            nll, targets = sft_loss(model, batch)
            # The loop divides the summed loss by the step's target count: scaled by this batch's count,
            # the penalty adds lambda x the tail norm per step.
            return nll + section.reg_weight * targets * tail_penalty(pairs, start, rank), targets

        return loss

    return loss_for


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the rank-r_i adapter ``adapter/*`` of ``msg`` with the self-pruning regulariser; reply with
    it (rank r_i) and the statistics."""
    section: HetLoRAConfig = ctx.cfg.section()
    trained, result, rank = train_at_rank(ctx, arrays(msg, ADAPTER), regularised_loss(section))
    reply: Payload = {ADAPTER + key: value for key, value in truncate(trained, rank).items()}
    reply.update(fit_scalars(ctx, result))
    return reply
