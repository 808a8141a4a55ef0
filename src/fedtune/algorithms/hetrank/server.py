"""The server's side both heterogeneous-rank methods share: who holds which rank, what each sampled
client is sent (the global adapter truncated to its rank) and what its reply must look like."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedtune.algorithms.adapters import ADAPTER
from fedtune.algorithms.base import Algorithm
from fedtune.algorithms.hetrank.config import ranks_problem
from fedtune.algorithms.hetrank.maths import assign_ranks, truncate
from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.config import ExperimentConfig
from fedtune.errors import RunError
from fedtune.fl.federation import Federation
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ReplySpec


def checked_ranks(cfg: ExperimentConfig, section: str, ranks: Sequence[int] | None) -> list[int]:
    """The configured ranks (``lora.r`` for every client when unset), refused above ``lora.r``."""
    problem = ranks_problem(section, ranks, cfg.lora.r)
    if problem:
        raise RunError(problem)
    return list(ranks) if ranks is not None else [cfg.lora.r]


def client_ranks(fed: Federation, ranks: Sequence[int]) -> dict[str, int]:
    """Every client's rank, ``ranks`` round-robin in the federation's client order."""
    return assign_ranks(fed.client_ids(), ranks)


def rank_messages(global_adapter: Mapping[str, np.ndarray], ranks: Mapping[str, int]) -> dict[str, Payload]:
    """Client -> its fit message: the global adapter's first r_i ranks (what it trains)."""
    sent: dict[int, Payload] = {}
    for rank in set(ranks.values()):
        sent[rank] = {ADAPTER + key: value for key, value in truncate(global_adapter, rank).items()}
    return {client: sent[rank] for client, rank in ranks.items()}


def rank_spec(
    message: Payload,
    scalars: Mapping[str, type],
    norm_bound: float | None,
    client_sizes: Mapping[str, int],
) -> ReplySpec:
    """A fit reply to ``message``: its adapter at the rank sent (shapes, dtypes; the update bounded by
    ``fed.norm_bound`` from what was sent) and the fit statistics."""
    adapter = {key: value for key, value in message.items() if isinstance(value, np.ndarray)}
    return ReplySpec.like(adapter, scalars=scalars, norm_bound=norm_bound, example_limits=client_sizes)


def collect_at_ranks(
    algorithm: Algorithm,
    fed: Federation,
    rnd: int,
    global_adapter: Mapping[str, np.ndarray],
    ranks: Mapping[str, int],
    scalars: Mapping[str, type] = REPLY_SCALARS,
) -> tuple[list[str], dict[str, Payload], list[int]]:
    """Sample clients, send each the global adapter at its rank and validate each reply against what that
    client was sent: a reply at any other rank is rejected (its shape named with the key). Returns
    ``(sampled, replies, example counts)``; raises ``RoundFailed`` below ``fed.min_replies``."""
    cfg = algorithm.cfg
    sampled = algorithm.sample_clients(fed, rnd)
    messages = rank_messages(global_adapter, {client: ranks[client] for client in sampled})
    specs = {
        client: rank_spec(message, scalars, cfg.fed.norm_bound, fed.client_sizes)
        for client, message in messages.items()
    }
    replies = fed.call(sampled, "fit", messages, timeout=cfg.fed.client_timeout, expect=specs)
    algorithm.require_replies(replies, sampled, fed.traffic)
    return sampled, replies, [int(r["num_examples"]) for r in replies.values()]
