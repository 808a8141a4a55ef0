"""A heterogeneous-rank client's local training: the adapter it was sent is at its own rank r_i.

The client's model holds LoRA at the run's ``lora.r`` (r_max). It zero-pads what it received to r_max,
trains only the first r_i ranks (a gradient mask keeps the padded ranks at exactly zero, so its model is
the rank-r_i adapter it was given) and replies with those r_i ranks. The client reads its rank from the
shapes it was sent and keeps nothing between rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from fedtune.algorithms.adapters import client_examples
from fedtune.algorithms.hetrank.maths import adapter_rank, rank_masks, zero_pad
from fedtune.algorithms.local import train_selected
from fedtune.fl.federation import ClientContext
from fedtune.models.lora import adapter_parameters, load_adapter
from fedtune.train.loop import LossFn, TrainResult, sft_loss

LossFor = Callable[[Mapping[str, torch.nn.Parameter], int], LossFn]
"""Builds the local loss from the trained parameters (keyed as the adapter) and the client's rank."""


def train_at_rank(
    ctx: ClientContext, received: Mapping[str, np.ndarray], loss_for: LossFor | None = None
) -> tuple[dict[str, np.ndarray], TrainResult, int]:
    """Train the rank-r_i adapter ``received`` on local data; returns (the adapter at r_max, whose ranks
    beyond r_i are zero; the training result; r_i)."""
    rank = adapter_rank(received)
    full_rank = ctx.cfg.lora.r
    if rank > full_rank:
        raise ValueError(f"client {ctx.client_id} was sent rank {rank}, above lora.r = {full_rank}")
    model, tokenizer = ctx.resources.lora_lm()
    load_adapter(model, zero_pad(received, full_rank))
    params = adapter_parameters(model)
    shapes = {key: tuple(p.shape) for key, p in params.items()}
    # A padded rank has both factors zero, so its gradients are zero too; the mask keeps it exactly zero
    # whatever the optimiser or a proximal term would do with it.
    masks = {key: torch.from_numpy(mask) for key, mask in rank_masks(shapes, rank).items() if not mask.all()}
    result = train_selected(
        ctx,
        model,
        params,
        client_examples(ctx),
        pad_token_id=int(tokenizer.pad_token_id or 0),
        grad_masks=masks,
        loss_fn=loss_for(params, rank) if loss_for is not None else sft_loss,
    )
    trained = {key: p.detach().float().cpu().numpy().copy() for key, p in params.items()}
    return trained, result, rank
