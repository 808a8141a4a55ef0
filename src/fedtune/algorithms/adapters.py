"""The shared LoRA-adapter toolkit of the methods that train an adapter on the run's ``model:``.

Client side: a client's tokenized data, fitting an adapter on it (``fit_adapter``), evaluating one
(``evaluate_adapter``) on a test set the client re-derives by name (``evaluation_records``). Server side:
sampling clients and collecting validated ``fit`` replies (``collect_adapters``) and the round's
statistics from them (``fit_round_result``). FedIT is these pieces and a weighted mean.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedtune.algorithms.base import Algorithm, RoundResult, evaluate_model
from fedtune.algorithms.local import REPLY_SCALARS, fit_reply, train_selected
from fedtune.config import ExperimentConfig
from fedtune.data.records import Record
from fedtune.data.tokenize import Example, encode_records
from fedtune.eval.evaluate import EvalResult
from fedtune.fl.federation import ClientContext, Federation
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ReplySpec
from fedtune.models.lora import adapter_parameters, load_adapter
from fedtune.resources import Resources

ADAPTER = "adapter/"


def evaluation_records(ctx: ClientContext, eval_set: str) -> list[Record]:
    """The run's evaluation set (``""``: the primary one, else an ``eval.extra_datasets`` name).

    Test sets are not private: every client derives the same ones from the config, as the server does.
    """
    from fedtune.rundata import prepare_data

    data = ctx.resources.get("run_data", lambda: prepare_data(ctx.cfg))
    return list(data.extra_eval[eval_set] if eval_set else data.eval_records)


def client_examples(ctx: ClientContext) -> list[Example]:
    """This client's tokenized training data, tokenized once per process."""
    _, tokenizer = ctx.resources.base_lm()
    data_cfg = ctx.cfg.data
    return ctx.resources.get(
        f"examples/{ctx.client_id}",
        lambda: encode_records(ctx.data, tokenizer, data_cfg.template, data_cfg.max_length),
    )


def fit_adapter(ctx: ClientContext, adapter: Mapping[str, np.ndarray], prox_mu: float) -> Payload:
    """Load ``adapter``, train it on local data, reply with the new adapter and statistics."""
    model, tokenizer = ctx.resources.lora_lm()
    load_adapter(model, adapter)
    params = adapter_parameters(model)
    result = train_selected(
        ctx,
        model,
        params,
        client_examples(ctx),
        pad_token_id=int(tokenizer.pad_token_id or 0),
        prox_mu=prox_mu,
    )
    return fit_reply(ctx, params, result, ADAPTER)


def evaluate_adapter(
    cfg: ExperimentConfig,
    resources: Resources,
    adapter: Mapping[str, np.ndarray],
    records: list[Record],
    rnd: int,
) -> EvalResult:
    """``adapter`` on the run's base model, evaluated on ``records`` (sampling seeded by the round)."""
    model, tokenizer = resources.lora_lm()
    load_adapter(model, adapter)
    return evaluate_model(cfg, model, tokenizer, records, rnd)


def collect_adapters(
    algorithm: Algorithm,
    fed: Federation,
    rnd: int,
    global_adapter: Mapping[str, np.ndarray],
    message: Payload | Mapping[str, Payload],
    *,
    reference: bool = True,
    sampled: list[str] | None = None,
) -> tuple[list[str], dict[str, Payload], list[int]]:
    """Sample clients, run their "fit" task and validate the replies against ``global_adapter``'s shapes.

    ``message`` is one broadcast payload or a payload per sampled client; ``sampled`` the clients
    when the caller has sampled them already.

    Returns ``(sampled, replies, example counts)``; raises ``RoundFailed`` below ``fed.min_replies``.
    """
    cfg = algorithm.cfg
    if sampled is None:
        sampled = algorithm.sample_clients(fed, rnd)
    spec = ReplySpec.like(
        {ADAPTER + k: v for k, v in global_adapter.items()},
        scalars=REPLY_SCALARS,
        norm_bound=cfg.fed.norm_bound,
        reference=reference,
        example_limits=fed.client_sizes,
    )
    replies = fed.call(sampled, "fit", message, timeout=cfg.fed.client_timeout, expect=spec)
    algorithm.require_replies(replies, sampled, fed.traffic)
    return sampled, replies, [int(r["num_examples"]) for r in replies.values()]


def fit_round_result(
    sampled: list[str], replies: Mapping[str, Payload], weights: list[int], extra: Mapping[str, float] = {}
) -> RoundResult:
    """The round's statistics from the clients' fit replies (loss weighted by example count); a round
    without replies (a Poisson sample under ``dp`` may be empty) has no loss and zero counts."""
    losses = [float(r["train_loss"]) for r in replies.values()]
    return RoundResult(
        clients=sampled,
        train_loss=float(np.average(losses, weights=weights)) if losses else None,
        num_examples=sum(weights),
        tokens=sum(int(r["tokens"]) for r in replies.values()),
        trained_examples=sum(int(r["trained_examples"]) for r in replies.values()),
        extra={
            "client_peak_mem_mb": max(
                (float(r.get("peak_mem_mb", 0.0)) for r in replies.values()), default=0.0
            ),
            **extra,
        },
    )
