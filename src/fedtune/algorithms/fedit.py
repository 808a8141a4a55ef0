"""FedIT: federated instruction tuning = FedAvg of LoRA adapters (Zhang et al.), with FedProx.

Round: sample clients; each loads the global adapter into the shared base model, runs E local
epochs of response-only SFT and returns its adapter and example count; the server averages
adapters weighted by example count and takes a server step (lr 1 = plain FedAvg).

Run modes (``fed.mode``): ``federated``; ``standalone`` (each client keeps and trains its own
adapter, nothing is aggregated; a client starts from the initial adapter the first time it is
sampled; evaluation is a client task -- each client evaluates its own adapter -- averaged over the
clients that hold one); ``centralized`` (the runner gives the union of client data to a single
client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from fedtune.algorithms.base import PERSONAL_EVAL, Algorithm, RoundResult, evaluate_model, personal_reply
from fedtune.algorithms.local import REPLY_SCALARS, fit_reply, train_selected
from fedtune.config import AlgorithmConfig, ExperimentConfig
from fedtune.data.records import Record
from fedtune.data.tokenize import Example, encode_records
from fedtune.eval.evaluate import EvalResult, mean_results, payload_result, result_payload
from fedtune.fl.aggregate import server_step, weighted_average
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ReplySpec
from fedtune.models.lora import adapter_parameters, load_adapter
from fedtune.resources import Resources

ADAPTER = "adapter/"


def current_eval_set(server: ServerContext) -> str:
    """Which test set the runner is evaluating: ``""`` (the primary one) or an extra dataset's name."""
    return next((name for name, recs in server.extra_eval.items() if recs is server.eval_records), "")


def evaluation_records(ctx: ClientContext, eval_set: str) -> list[Record]:
    """The run's evaluation set (``""``: the primary one, else an ``eval.extra_datasets`` name).

    Test sets are not private: every client derives the same ones from the config, as the server does.
    """
    from fedtune.data.rundata import prepare_data

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
        sampled = fed.sample(algorithm.clients_per_round(fed), rnd)
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
    """The round's statistics from the clients' fit replies (loss weighted by example count)."""
    losses = [float(r["train_loss"]) for r in replies.values()]
    return RoundResult(
        clients=sampled,
        train_loss=float(np.average(losses, weights=weights)),
        num_examples=sum(weights),
        tokens=sum(int(r["tokens"]) for r in replies.values()),
        trained_examples=sum(int(r["trained_examples"]) for r in replies.values()),
        extra={
            "client_peak_mem_mb": max(float(r.get("peak_mem_mb", 0.0)) for r in replies.values()),
            **extra,
        },
    )


class FedITConfig(AlgorithmConfig):
    """FedIT = FedAvg of LoRA states weighted by example count; FedProx when ``prox_mu > 0``."""

    modes = ("federated", "standalone", "centralized")
    personal_eval = True

    prox_mu: float = Field(0.0, ge=0)
    server_lr: float = Field(1.0, gt=0)


class FedIT(Algorithm[FedITConfig]):
    name = "fedit"
    Config = FedITConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.holders: set[str] = set()  # standalone: the clients that hold a personal adapter

    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit, "evaluate": self._evaluate_own, PERSONAL_EVAL: self._evaluate_personal}

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        adapter = arrays(msg, ADAPTER)
        if self.cfg.fed.mode == "standalone":
            # The client's own adapter persists; the server sends the initial one only to clients without.
            adapter = ctx.state.get("adapter", adapter)
            if not adapter:
                raise ValueError(f"client {ctx.client_id} holds no adapter and was sent none")
        reply = fit_adapter(ctx, adapter, self.section.prox_mu)
        if self.cfg.fed.mode == "standalone":
            ctx.state["adapter"] = arrays(reply, ADAPTER)
        return reply

    def _evaluate_own(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Evaluate this client's own adapter (standalone mode) on the set ``msg["eval_set"]`` names."""
        adapter = ctx.state.get("adapter")
        if not adapter:
            raise ValueError(f"client {ctx.client_id} holds no adapter to evaluate")
        records = evaluation_records(ctx, str(msg.get("eval_set", "")))
        rnd = int(msg["round"])
        return result_payload(evaluate_adapter(ctx.cfg, ctx.resources, adapter, records, rnd))

    def _evaluate_personal(self, ctx: ClientContext, msg: Payload) -> Payload:
        """This client's model on its own held-out split: its own adapter in standalone mode (the
        initial one, sent along, before it first trains), else the global adapter it was sent."""
        adapter = arrays(msg, ADAPTER)
        if self.cfg.fed.mode == "standalone":
            adapter = ctx.state.get("adapter") or adapter
        if not adapter:
            raise ValueError(f"client {ctx.client_id} holds no adapter to evaluate and was sent none")
        if not ctx.eval_data:
            raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout, eval.personal)")
        rnd = int(msg["round"])
        result = evaluate_adapter(ctx.cfg, ctx.resources, adapter, ctx.eval_data, rnd)
        return personal_reply(result, len(ctx.eval_data), rnd)

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        if self.cfg.fed.mode != "standalone":
            return {**self._broadcast(), "round": rnd}
        messages: dict[str, Payload] = {}
        for cid in clients:  # only a client without an adapter of its own needs the initial one
            messages[cid] = {"round": rnd} if cid in self.holders else {**self._broadcast(), "round": rnd}
        return messages

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        if self.cfg.fed.mode != "standalone":
            sampled, replies, weights = collect_adapters(
                self, fed, rnd, self.global_adapter, self._broadcast()
            )
            average = weighted_average([arrays(r, ADAPTER) for r in replies.values()], weights)
            self.global_adapter = server_step(self.global_adapter, average, self.section.server_lr)
            return fit_round_result(sampled, replies, weights)
        # Standalone: only a client that holds no adapter yet is sent the initial one.
        sampled = fed.sample(self.clients_per_round(fed), rnd)
        messages = {cid: {} if cid in self.holders else self._broadcast() for cid in sampled}
        sampled, replies, weights = collect_adapters(
            self, fed, rnd, self.global_adapter, messages, reference=False, sampled=sampled
        )
        self.holders.update(replies)
        return fit_round_result(sampled, replies, weights)

    def _broadcast(self) -> Payload:
        return {ADAPTER + k: v for k, v in self.global_adapter.items()}

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation) -> EvalResult:
        if self.cfg.fed.mode == "standalone" and rnd > 0 and self.holders:
            holders = [cid for cid in fed.client_ids() if cid in self.holders]
            message: Payload = {"eval_set": current_eval_set(server), "round": rnd}
            replies = fed.call(holders, "evaluate", message)
            if replies:
                return mean_results([payload_result(replies[cid]) for cid in holders if cid in replies])
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, server.eval_records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {"global_adapter": self.global_adapter, "holders": sorted(self.holders)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.holders = set(state.get("holders", []))
