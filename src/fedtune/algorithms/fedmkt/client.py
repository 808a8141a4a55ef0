"""FedMKT's parties. A client holds its own SLM with its own LoRA (``ctx.state["adapter"]``), which
never leaves it (except with ``slm_fedavg``), and the losses it computed on the public set; its tasks:
``fit``, ``distill`` and ``evaluate_personal``.

The server's LLM is a party like any client: it builds its LoRA (``lora_model``), views the public
set (``public_view_of``), computes its knowledge (``knowledge``) and aligns what it receives
(``transfer_rows``) with the functions here, which hold nothing but a process's caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedtune.algorithms.adapters import evaluation_records
from fedtune.algorithms.base import derive_seed, evaluate_model
from fedtune.algorithms.fedmkt.config import FedMKTConfig
from fedtune.algorithms.fedmkt.transfer import (
    NOT_SELECTED,
    PublicView,
    Teacher,
    alignments,
    dual_min_ce,
    kd_batches,
    mixed_loss_fn,
    public_knowledge,
    public_view,
    teacher_rows,
)
from fedtune.algorithms.fedmkt.wire import ADAPTER, LLM, PUBLIC, Knowledge, public_subset, unpack_knowledge
from fedtune.algorithms.local import fit_scalars, train_selected
from fedtune.algorithms.personal import personal_reply
from fedtune.align import vocab_map
from fedtune.config import ExperimentConfig
from fedtune.data.records import Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.lora import adapter_arrays, adapter_parameters, build_lora, load_adapter
from fedtune.models.spec import ModelSpec
from fedtune.resources import Resources, model_spec
from fedtune.train.loop import TrainResult


# ----- every party ----------------------------------------------------------------------------------
def slm_spec(cfg: ExperimentConfig, client: str) -> ModelSpec:
    """The model ``client`` holds: ``fedmkt.clients[NN % len]`` for client ``cNN``, else (and in
    ``fed.mode: centralized``, whose one party tunes the run's model) ``model:``."""
    section: FedMKTConfig = cfg.section("fedmkt")
    base = model_spec(cfg.model, cfg.seed)
    if cfg.fed.mode == "centralized" or not section.clients:
        return base
    return base.replace(name=section.client_model(client))


def lora_model(
    cfg: ExperimentConfig, resources: Resources, spec: ModelSpec
) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """``spec``'s model with LoRA (``lora:``), its tokenizer and its initial adapter: one per spec
    and process, so every party holding the same model starts from the same LoRA."""

    def build() -> tuple[Any, Any, dict[str, np.ndarray]]:
        model, tokenizer = resources.model(spec)
        peft = build_lora(model, cfg.lora, seed=derive_seed(cfg.seed, "fedmkt-lora", spec.name))
        return peft, tokenizer, dict(adapter_arrays(peft))

    triple: tuple[Any, Any, dict[str, np.ndarray]] = resources.get(f"fedmkt/lora/{spec.key}", build)
    return triple


def public_records(cfg: ExperimentConfig, records: Sequence[Record]) -> list[Record]:
    """The public examples every party uses (``fedmkt.public_examples`` of ``records``)."""
    return public_subset(records, cfg.section("fedmkt").public_examples, cfg.seed)


def public_view_of(
    cfg: ExperimentConfig, resources: Resources, spec: ModelSpec, records: Sequence[Record]
) -> PublicView:
    """``spec``'s tokenizer's view of the public set, once per spec and process."""
    data = cfg.data
    tokenizer = resources.tokenizer(spec)
    return resources.get(
        f"fedmkt/view/{spec.key}",
        lambda: public_view(records, tokenizer, data.template, data.max_length),
    )


def knowledge(cfg: ExperimentConfig, model: Any, tokenizer: Any, view: PublicView) -> Knowledge:
    """``model``'s loss and top-k on every public sample (batches of ``eval.batch_size``, in order)."""
    batches = make_batches(
        view.examples,
        cfg.eval.batch_size,
        int(tokenizer.pad_token_id or 0),
        seed=0,
        bucketing=False,
        shuffle=False,
    )
    losses, ids, values = public_knowledge(model, batches, cfg.section("fedmkt").top_k, len(tokenizer))
    return Knowledge(losses, ids, values)


def transfer_rows(
    cfg: ExperimentConfig,
    resources: Resources,
    received: Knowledge,
    sender: ModelSpec,
    receiver: ModelSpec,
    records: Sequence[Record],
) -> list[Teacher]:
    """``sender``'s knowledge on ``receiver``'s response tokens (alignment cached per pair)."""
    s_view = public_view_of(cfg, resources, sender, records)
    r_view = public_view_of(cfg, resources, receiver, records)
    pair = f"{sender.key}->{receiver.key}"
    vmap = resources.get(
        f"fedmkt/vmap/{pair}",
        lambda: vocab_map(resources.tokenizer(sender), resources.tokenizer(receiver)),
    )
    matches = resources.get(f"fedmkt/match/{pair}", lambda: alignments(s_view, r_view))
    return teacher_rows(received, s_view, r_view, matches, vmap)


# ----- the client's tasks ---------------------------------------------------------------------------
def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Alg. 1 lines 3-6: E epochs on the private data, then loss and top-k on the public set
    (``fed.mode: centralized``: `fit_centralized`)."""
    cfg, section = ctx.cfg, ctx.cfg.section("fedmkt")
    if cfg.fed.mode == "centralized":
        return fit_centralized(ctx, msg)
    model, tokenizer, spec = _own(ctx)
    params = adapter_parameters(model)
    data = cfg.data
    examples = ctx.resources.get(
        f"fedmkt/examples/{ctx.client_id}",
        lambda: encode_records(ctx.data, tokenizer, data.template, data.max_length),
    )
    result = train_selected(ctx, model, params, examples, pad_token_id=int(tokenizer.pad_token_id or 0))
    ctx.state["adapter"] = dict(adapter_arrays(model))
    reply: Payload = dict(fit_scalars(ctx, result))
    if section.slm_fedavg:
        reply.update({ADAPTER + k: v for k, v in ctx.state["adapter"].items()})
    if cfg.fed.mode == "federated":
        view = public_view_of(cfg, ctx.resources, spec, public_records(cfg, ctx.public))
        own = knowledge(cfg, model, tokenizer, view)
        ctx.state["public_loss"] = own.losses
        reply.update(own.pack(PUBLIC, len(tokenizer), compress=section.compress))
    return reply


def fit_centralized(ctx: ClientContext, msg: Payload) -> Payload:
    """The Centralized baseline's one party: the adapter it was sent (the server's, so a resumed run
    goes on from the checkpoint), ``train:`` on its data (every client's) plus the public set, the
    trained adapter in the reply. ``num_examples`` stays the private count (what the server knows the
    party holds); ``trained_examples`` counts the public examples too."""
    cfg = ctx.cfg
    spec = slm_spec(cfg, ctx.client_id)
    model, tokenizer, _ = lora_model(cfg, ctx.resources, spec)
    load_adapter(model, {k: np.asarray(v, dtype=np.float32) for k, v in arrays(msg, ADAPTER).items()})
    data = cfg.data
    examples = ctx.resources.get(
        f"fedmkt/central-examples/{ctx.client_id}",
        lambda: encode_records(
            [*ctx.data, *public_records(cfg, ctx.public)], tokenizer, data.template, data.max_length
        ),
    )
    params = adapter_parameters(model)
    result = train_selected(ctx, model, params, examples, pad_token_id=int(tokenizer.pad_token_id or 0))
    reply: Payload = dict(fit_scalars(ctx, result))
    reply.update({ADAPTER + k: v for k, v in adapter_arrays(model).items()})
    return reply


def distill(ctx: ClientContext, msg: Payload) -> Payload:
    """Alg. 1 lines 13-16: align the LLM's knowledge, keep samples it predicts better, train."""
    cfg = ctx.cfg
    if arrays(msg, ADAPTER):
        ctx.state["adapter"] = {k: np.asarray(v, dtype=np.float32) for k, v in arrays(msg, ADAPTER).items()}
    model, tokenizer, spec = _own(ctx)
    if "public_loss" not in ctx.state:
        raise ValueError(f"client {ctx.client_id} got the LLM's knowledge before computing its own")
    records = public_records(cfg, ctx.public)
    llm_spec = model_spec(cfg.model, cfg.seed)
    llm_view = public_view_of(cfg, ctx.resources, llm_spec, records)
    llm_vocab = ctx.resources.vocab_size(llm_spec)
    llm_knowledge = unpack_knowledge(msg, LLM, llm_view.counts, llm_vocab, cfg.section("fedmkt").top_k)
    teachers = transfer_rows(cfg, ctx.resources, llm_knowledge, llm_spec, spec, records)
    selected = dual_min_ce(llm_knowledge.losses[None, :], ctx.state["public_loss"]) != NOT_SELECTED
    view = public_view_of(cfg, ctx.resources, spec, records)
    result, stats = _train_mixed(ctx, model, tokenizer, view, teachers, selected)
    ctx.state["adapter"] = dict(adapter_arrays(model))
    return {"kd_selected": int(selected.sum()), "kd_loss": float(result.loss), **stats}


def evaluate_personal(ctx: ClientContext, msg: Payload) -> Payload:
    """The client's SLM on its held-out split (or, with ``slm_eval: test``, the run's test set)."""
    section: FedMKTConfig = ctx.cfg.section("fedmkt")
    records = evaluation_records(ctx, "") if section.slm_eval == "test" else ctx.eval_data
    if not records:
        raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout)")
    model, tokenizer, _ = _own(ctx)
    rnd = int(msg["round"])
    result = evaluate_model(ctx.cfg, model, tokenizer, records, rnd)
    return personal_reply(result, len(records), rnd)


def _own(ctx: ClientContext) -> tuple[Any, Any, ModelSpec]:
    """The client's SLM with its own LoRA loaded (the initial one before its first training)."""
    spec = slm_spec(ctx.cfg, ctx.client_id)
    model, tokenizer, initial = lora_model(ctx.cfg, ctx.resources, spec)
    load_adapter(model, ctx.state.get("adapter", initial))
    return model, tokenizer, spec


def _train_mixed(
    ctx: ClientContext,
    model: Any,
    tokenizer: Any,
    view: PublicView,
    teachers: list[Teacher],
    selected: np.ndarray,
) -> tuple[TrainResult, dict[str, float]]:
    """``train:`` on the public set with ``lam CE + (1 - lam) KD`` (KD on the ``selected`` samples)."""
    cfg = ctx.cfg
    seed = derive_seed(cfg.seed, ctx.rnd, ctx.client_id, "fedmkt-kd")
    pad = int(tokenizer.pad_token_id or 0)
    batches = kd_batches(view.examples, teachers, selected, cfg.train, pad, seed=seed)
    stats: dict[str, float] = {}
    result = train_selected(
        ctx,
        model,
        adapter_parameters(model),
        [],
        pad_token_id=0,
        batches=batches,
        loss_fn=mixed_loss_fn(cfg.section("fedmkt").lam, stats),
    )
    return result, {"kd_ce_sum": stats.get("ce", 0.0), "kd_sum": stats.get("kd", 0.0)}
