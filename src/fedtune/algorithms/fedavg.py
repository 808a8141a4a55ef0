"""FedIT: federated instruction tuning = FedAvg of LoRA adapters (Zhang et al.), with FedProx.

Round: sample clients; each loads the global adapter into the shared base model, runs E local
epochs of response-only SFT and returns its adapter and example count; the server averages
adapters weighted by example count and takes a server step (lr 1 = plain FedAvg).

Run modes (``fed.mode``): ``federated``; ``standalone`` (each client keeps and trains its own
adapter, nothing is aggregated, evaluation averages the client models); ``centralized`` (the
runner gives the union of client data to a single client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed
from fedtune.algorithms.registry import register
from fedtune.config import FedITConfig
from fedtune.data.tokenize import Example, encode_records
from fedtune.eval.evaluate import EvalResult, evaluate_lm, mean_results
from fedtune.fl.aggregate import server_step, weighted_average
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ReplySpec
from fedtune.models.lora import adapter_arrays, load_adapter
from fedtune.train.sft import local_sft

ADAPTER = "adapter/"
REPLY_SCALARS = {"num_examples": int, "train_loss": float, "tokens": int}


def client_examples(ctx: ClientContext) -> list[Example]:
    """This client's tokenized training data, tokenized once per process."""
    _, tokenizer = ctx.resources.lora_lm()
    data_cfg = ctx.cfg.data
    return ctx.resources.get(
        f"examples/{ctx.client_id}",
        lambda: encode_records(ctx.data, tokenizer, data_cfg.template, data_cfg.max_length),
    )


def fit_adapter(ctx: ClientContext, adapter: Mapping[str, np.ndarray], prox_mu: float) -> Payload:
    """Load ``adapter``, train it on local data, reply with the new adapter and statistics."""
    model, tokenizer = ctx.resources.lora_lm()
    load_adapter(model, adapter)
    result = local_sft(
        model,
        client_examples(ctx),
        ctx.cfg.train,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        seed=derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id),
        rnd=ctx.rnd,
        rounds=ctx.cfg.fed.rounds,
        bucketing=ctx.cfg.data.length_bucketing,
        prox_mu=prox_mu,
        report=ctx.report,
    )
    reply: Payload = {ADAPTER + k: v for k, v in adapter_arrays(model).items()}
    reply.update(
        num_examples=len(ctx.data),
        train_loss=float(result.loss),
        tokens=int(result.tokens),
        peak_mem_mb=float(result.peak_mem_mb),
    )
    return reply


def collect_adapters(
    algorithm: Algorithm,
    fed: Federation,
    rnd: int,
    global_adapter: Mapping[str, np.ndarray],
    message: Payload | Mapping[str, Payload],
    *,
    reference: bool = True,
) -> tuple[list[str], dict[str, Payload], list[int]]:
    """Sample clients, run their "fit" task and validate the replies against ``global_adapter``'s shapes.

    ``message`` is one broadcast payload or a payload per sampled client.

    Returns ``(sampled, replies, example counts)``; raises ``RoundFailed`` below ``fed.min_replies``.
    """
    cfg = algorithm.cfg
    sampled = fed.sample(algorithm.clients_per_round(fed), rnd)
    spec = ReplySpec.like(
        {ADAPTER + k: v for k, v in global_adapter.items()},
        scalars=REPLY_SCALARS,
        norm_bound=cfg.fed.norm_bound,
        reference=reference,
    )
    replies = fed.call(sampled, "fit", message, timeout=cfg.fed.client_timeout, expect=spec)
    algorithm.require_replies(replies, sampled)
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
        extra={
            "client_peak_mem_mb": max(float(r.get("peak_mem_mb", 0.0)) for r in replies.values()),
            **extra,
        },
    )


@register
class FedIT(Algorithm):
    name = "fedit"
    Config = FedITConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}

    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit}

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        adapter = arrays(msg, ADAPTER)
        if self.cfg.fed.mode == "standalone":
            # The client's own adapter persists; the server sends nothing to start from after round 1.
            adapter = ctx.state.get("adapter", adapter)
        reply = fit_adapter(ctx, adapter, self.section.prox_mu)
        if self.cfg.fed.mode == "standalone":
            ctx.state["adapter"] = arrays(reply, ADAPTER)
        return reply

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        standalone = self.cfg.fed.mode == "standalone"
        message: Payload = {} if standalone and rnd > 1 else self._broadcast()
        sampled, replies, weights = collect_adapters(
            self, fed, rnd, self.global_adapter, message, reference=not standalone
        )
        if not standalone:
            average = weighted_average([arrays(r, ADAPTER) for r in replies.values()], weights)
            self.global_adapter = server_step(self.global_adapter, average, self.section.server_lr)
        return fit_round_result(sampled, replies, weights)

    def _broadcast(self) -> Payload:
        return {ADAPTER + k: v for k, v in self.global_adapter.items()}

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation) -> EvalResult:
        if self.cfg.fed.mode == "standalone" and rnd > 0:
            states = getattr(fed, "states", {})
            personal = [s["adapter"] for s in states.values() if "adapter" in s]
            if personal:
                return mean_results([self._evaluate_adapter(a, server, rnd) for a in personal])
        return self._evaluate_adapter(self.global_adapter, server, rnd)

    def _evaluate_adapter(
        self, adapter: Mapping[str, np.ndarray], server: ServerContext, rnd: int
    ) -> EvalResult:
        model, tokenizer = server.resources.lora_lm()
        load_adapter(model, adapter)
        return evaluate_lm(
            model,
            tokenizer,
            server.eval_records,
            self.cfg.eval,
            template=self.cfg.data.template,
            max_length=self.cfg.data.max_length,
            seed=derive_seed(self.cfg.seed, rnd, "eval"),
        )

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {"global_adapter": self.global_adapter}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
