"""What a FedIT client runs: local SFT of the LoRA adapter it was sent, and evaluations of its own.

A client holds its own records and, in standalone mode, its own adapter (``ctx.state["adapter"]``),
which persists across rounds and never leaves the client except as its reply to ``fit``. Every task
reads the run's config from its context (``ctx.cfg``): ``fed.mode`` and ``fedit.prox_mu``.
"""

from __future__ import annotations

from fedtune.algorithms.adapters import ADAPTER, evaluate_adapter, evaluation_records, fit_adapter
from fedtune.algorithms.fedit.config import FedITConfig
from fedtune.algorithms.personal import personal_reply
from fedtune.eval.evaluate import result_payload
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the adapter ``adapter/*`` of ``msg`` (standalone: this client's own, once it holds one) on
    local data, with FedProx's ``prox_mu``; reply with the new adapter and the fit statistics."""
    section: FedITConfig = ctx.cfg.section()
    adapter = arrays(msg, ADAPTER)
    if ctx.cfg.fed.mode == "standalone":
        # The client's own adapter persists; the server sends the initial one only to clients without.
        adapter = ctx.state.get("adapter", adapter)
        if not adapter:
            raise ValueError(f"client {ctx.client_id} holds no adapter and was sent none")
    reply = fit_adapter(ctx, adapter, section.prox_mu)
    if ctx.cfg.fed.mode == "standalone":
        ctx.state["adapter"] = arrays(reply, ADAPTER)
    return reply


def evaluate_own(ctx: ClientContext, msg: Payload) -> Payload:
    """Evaluate this client's own adapter (standalone mode) on the set ``msg["eval_set"]`` names."""
    adapter = ctx.state.get("adapter")
    if not adapter:
        raise ValueError(f"client {ctx.client_id} holds no adapter to evaluate")
    records = evaluation_records(ctx, str(msg.get("eval_set", "")))
    rnd = int(msg["round"])
    return result_payload(evaluate_adapter(ctx.cfg, ctx.resources, adapter, records, rnd))


def evaluate_personal(ctx: ClientContext, msg: Payload) -> Payload:
    """This client's model on its own held-out split: its own adapter in standalone mode (the
    initial one, sent along, before it first trains), else the global adapter it was sent."""
    adapter = arrays(msg, ADAPTER)
    if ctx.cfg.fed.mode == "standalone":
        adapter = ctx.state.get("adapter") or adapter
    if not adapter:
        raise ValueError(f"client {ctx.client_id} holds no adapter to evaluate and was sent none")
    if not ctx.eval_data:
        raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout, eval.personal)")
    rnd = int(msg["round"])
    result = evaluate_adapter(ctx.cfg, ctx.resources, adapter, ctx.eval_data, rnd)
    return personal_reply(result, len(ctx.eval_data), rnd)
