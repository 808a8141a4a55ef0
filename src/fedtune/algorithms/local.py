"""The client's local training step shared by every method: train selected parameters, reply.

A method picks *what* trains (LoRA, whole adapter layers, a task head, any mix), optionally which
entries of it (element-wise gradient masks, e.g. PerFIT's sparse LoRA) and how far from the start
it may drift (a proximal term, e.g. FedProx or FedBiOT's eps); this module runs the round's local
SFT on the client's own examples and builds the reply every aggregation reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedtune.algorithms.base import derive_seed
from fedtune.data.tokenize import Example
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload
from fedtune.train.loop import Batch, LossFn, TrainResult, sft_loss
from fedtune.train.sft import local_sft

# num_examples: the client's data size, FedAvg's aggregation weight; trained_examples: what it trained on
# this round (steps x batch x accumulation, repeats included).
REPLY_SCALARS = {"num_examples": int, "trained_examples": int, "train_loss": float, "tokens": int}


def train_selected(
    ctx: ClientContext,
    model: torch.nn.Module,
    params: Mapping[str, torch.nn.Parameter],
    examples: Sequence[Example],
    *,
    pad_token_id: int,
    prox_mu: float = 0.0,
    grad_masks: Mapping[str, torch.Tensor] | None = None,
    batches: Sequence[Batch] | None = None,
    loss_fn: LossFn = sft_loss,
) -> TrainResult:
    """One round of local SFT of exactly ``params`` on ``examples``, seeded by (seed, round, client).

    ``grad_masks`` is keyed like ``params``; entries outside a mask neither train nor move.
    ``batches``/``loss_fn``: prebuilt batches and their loss instead (``local_sft``).
    """
    names = {id(p): name for name, p in model.named_parameters()}
    masks = None
    if grad_masks:
        unknown = sorted(set(grad_masks) - set(params))
        if unknown:
            raise KeyError(f"gradient mask for a parameter that is not trained: {unknown[0]}")
        masks = {names[id(params[key])]: mask for key, mask in grad_masks.items()}
    return local_sft(
        model,
        examples,
        ctx.cfg.train,
        pad_token_id=pad_token_id,
        seed=derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id),
        rnd=ctx.rnd,
        rounds=ctx.cfg.fed.rounds,
        bucketing=ctx.cfg.data.length_bucketing,
        prox_mu=prox_mu,
        report=ctx.report,
        trainable=params,
        grad_masks=masks,
        batches=batches,
        loss_fn=loss_fn,
    )


def fit_reply(
    ctx: ClientContext, params: Mapping[str, torch.nn.Parameter], result: TrainResult, prefix: str
) -> Payload:
    """The trained ``params`` (fp32 arrays under ``prefix``) and the round's statistics."""
    reply: Payload = {prefix + k: p.detach().float().cpu().numpy().copy() for k, p in params.items()}
    reply.update(fit_scalars(ctx, result))
    return reply


def fit_scalars(ctx: ClientContext, result: TrainResult) -> Payload:
    """The round's statistics every fit reply carries (``REPLY_SCALARS`` plus the peak memory)."""
    return {
        "num_examples": len(ctx.data),
        "trained_examples": int(result.num_examples),
        "train_loss": float(result.loss),
        "tokens": int(result.tokens),
        "peak_mem_mb": float(result.peak_mem_mb),
    }
