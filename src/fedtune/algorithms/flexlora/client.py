"""What a FlexLoRA client runs: LoRA fine-tuning at the rank it was sent (``hetrank.client``)."""

from __future__ import annotations

from fedtune.algorithms.adapters import ADAPTER
from fedtune.algorithms.hetrank.client import train_at_rank
from fedtune.algorithms.hetrank.maths import truncate
from fedtune.algorithms.local import fit_scalars
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the rank-r_i adapter ``adapter/*`` of ``msg``; reply with it (rank r_i) and the statistics."""
    trained, result, rank = train_at_rank(ctx, arrays(msg, ADAPTER))
    reply: Payload = {ADAPTER + key: value for key, value in truncate(trained, rank).items()}
    reply.update(fit_scalars(ctx, result))
    return reply
