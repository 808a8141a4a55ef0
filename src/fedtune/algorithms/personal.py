"""Client-side evaluation (``eval.personal``): the task name, a client's reply, and the server's checks
and average of the replies. A method with ``Config.personal_eval`` provides the client task
``PERSONAL_EVAL`` and ``Algorithm.personal_messages``; ``Algorithm.evaluate_clients`` does the rest."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import (
    EvalResult,
    client_results,
    implausible_metric,
    payload_result,
    result_payload,
)
from fedtune.fl.federation import Federation
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ReplySpec

PERSONAL_EVAL = "evaluate_personal"
"""The client task of the client-side evaluation; its reply: ``result_payload`` + these scalars."""
EVAL_EXAMPLES = "num_eval_examples"


def personal_reply(result: EvalResult, num_examples: int, rnd: int) -> Payload:
    """A client's reply to ``evaluate_personal``: its metrics, held-out size and the round."""
    reply = result_payload(result)
    reply.update({EVAL_EXAMPLES: int(num_examples), "round": int(rnd)})
    return reply


def held_out_limit(train_size: int | None, holdout: float) -> int | None:
    """The most records a client training on ``train_size`` can hold out at share ``holdout``: the split
    holds out ``round(h N)`` of its N records, so at most ``ceil(h n / (1 - h)) + 1``; None when unknown
    (no size, or ``holdout`` 0: the method scores clients on another set)."""
    if not train_size or holdout <= 0:
        return None
    return int(np.ceil(holdout * train_size / (1 - holdout))) + 1


def personal_results(replies: Mapping[str, Payload], prefix: str = "personal/") -> EvalResult:
    """The clients' ``evaluate_personal`` replies averaged: ``<prefix><metric>`` plain and weighted by
    each client's held-out size."""
    results = {cid: payload_result(reply) for cid, reply in replies.items()}
    sizes = {cid: int(reply[EVAL_EXAMPLES]) for cid, reply in replies.items()}
    return client_results(results, sizes, prefix)


def personal_replies(
    cfg: ExperimentConfig, fed: Federation, messages: Payload | Mapping[str, Payload]
) -> dict[str, Payload]:
    """Every client's reply to ``evaluate_personal`` given ``messages``; a reply with an implausible metric
    or more held-out records than its client can hold is rejected (``fed.traffic.rejected``)."""
    clients = fed.client_ids()
    spec = ReplySpec(scalars={EVAL_EXAMPLES: int, "round": int})
    replies = fed.call(clients, PERSONAL_EVAL, messages, timeout=cfg.fed.client_timeout, expect=spec)
    holdout = cfg.data.holdout
    for client, reply in list(replies.items()):
        implausible = implausible_metric(reply)
        if implausible is not None:
            fed.traffic.rejected[client] = implausible
            del replies[client]
            continue
        limit = held_out_limit(fed.client_sizes.get(client), holdout)
        if limit is not None and int(reply[EVAL_EXAMPLES]) > limit:
            fed.traffic.rejected[client] = (
                f"{EVAL_EXAMPLES} {reply[EVAL_EXAMPLES]} exceeds the {limit} records a client training "
                f"on {fed.client_sizes[client]} can hold out (data.holdout {holdout})"
            )
            del replies[client]
    return replies
