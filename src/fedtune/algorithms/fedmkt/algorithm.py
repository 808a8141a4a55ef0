"""FedMKT's rounds: clients' SLMs and the server's LLM teach each other through the public set."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import evaluation_records, fit_round_result
from fedtune.algorithms.base import (
    PERSONAL_EVAL,
    Algorithm,
    RoundResult,
    derive_seed,
    evaluate_model,
    personal_reply,
)
from fedtune.algorithms.fedmkt.config import FedMKTConfig
from fedtune.algorithms.fedmkt.maths import NOT_SELECTED, dual_min_ce, mixed_loss_fn, public_knowledge
from fedtune.algorithms.fedmkt.transfer import (
    PublicView,
    Teacher,
    alignments,
    kd_batches,
    public_view,
    teacher_rows,
)
from fedtune.algorithms.fedmkt.wire import Knowledge, knowledge_spec, unpack_knowledge
from fedtune.algorithms.local import REPLY_SCALARS, fit_scalars, train_selected
from fedtune.align import vocab_map
from fedtune.data.records import DataError, Record
from fedtune.data.tokenize import Example, encode_records, make_batches
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import weighted_average
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ArraySpec, ReplySpec
from fedtune.models.lora import adapter_arrays, adapter_parameters, attach_lora, load_adapter
from fedtune.models.spec import ModelSpec
from fedtune.resources import Resources
from fedtune.train.sft import local_sft

PUBLIC = "public/"
"""A client's knowledge of the public set (fit reply)."""
LLM = "llm/"
"""The LLM's knowledge of the public set (distill message)."""
ADAPTER = "adapter/"
"""SLM LoRA states, only with ``slm_fedavg`` (homogeneous setting)."""
KD_SCALARS = {"kd_selected": int, "kd_loss": float}


def client_index(client: str) -> int:
    """The number a client id ends with (``c03`` -> 3): which of ``fedmkt.clients`` it holds."""
    found = re.search(r"(\d+)$", client)
    if found is None:
        raise ValueError(
            f"client id {client!r} does not end with its index; fedmkt.clients is assigned by it"
        )
    return int(found.group(1))


def public_subset(records: Sequence[Record], count: int | None, seed: int) -> list[Record]:
    """The public examples every party uses: all, or a seeded sample of ``count`` in original order."""
    if not records:
        raise DataError("fedmkt transfers knowledge on a public set, but the dataset has no 'public' split")
    if count is None or count >= len(records):
        return list(records)
    chosen = sorted(random.Random(derive_seed(seed, "fedmkt-public")).sample(range(len(records)), count))
    return [records[i] for i in chosen]


class FedMKT(Algorithm[FedMKTConfig]):
    name = "fedmkt"
    Config = FedMKTConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.llm_adapter: dict[str, np.ndarray] = {}

    # ----- models and views -------------------------------------------------------------------------
    def client_model_spec(self, client: str) -> ModelSpec:
        names = self.section.clients
        base = super().client_model_spec(client)
        return base.replace(name=names[client_index(client) % len(names)]) if names else base

    def lora(self, resources: Resources, spec: ModelSpec) -> tuple[Any, Any, dict[str, np.ndarray]]:
        """``spec``'s model with LoRA (``lora:``), its tokenizer and its initial adapter: one per spec
        and process, so every party holding the same model starts from the same LoRA."""

        def build() -> tuple[Any, Any, dict[str, np.ndarray]]:
            model, tokenizer = resources.model(spec)
            lora = self.cfg.lora
            peft = attach_lora(
                model,
                r=lora.r,
                alpha=lora.alpha,
                dropout=lora.dropout,
                target_modules=None if lora.target_modules == "auto" else lora.target_modules,
                seed=derive_seed(self.cfg.seed, "fedmkt-lora", spec.name),
            )
            return peft, tokenizer, dict(adapter_arrays(peft))

        triple: tuple[Any, Any, dict[str, np.ndarray]] = resources.get(f"fedmkt/lora/{spec.key}", build)
        return triple

    def view(self, resources: Resources, spec: ModelSpec, records: Sequence[Record]) -> PublicView:
        data = self.cfg.data
        tokenizer = resources.tokenizer(spec)
        return resources.get(
            f"fedmkt/view/{spec.key}",
            lambda: public_view(records, tokenizer, data.template, data.max_length),
        )

    def transfer_rows(
        self,
        resources: Resources,
        knowledge: Knowledge,
        sender: ModelSpec,
        receiver: ModelSpec,
        records: Sequence[Record],
    ) -> list[Teacher]:
        """``sender``'s knowledge on ``receiver``'s response tokens (alignment cached per pair)."""
        s_view, r_view = self.view(resources, sender, records), self.view(resources, receiver, records)
        pair = f"{sender.key}->{receiver.key}"
        vmap = resources.get(
            f"fedmkt/vmap/{pair}",
            lambda: vocab_map(resources.tokenizer(sender), resources.tokenizer(receiver)),
        )
        matches = resources.get(f"fedmkt/match/{pair}", lambda: alignments(s_view, r_view))
        return teacher_rows(knowledge, s_view, r_view, matches, vmap)

    def public(self, records: Sequence[Record]) -> list[Record]:
        return public_subset(records, self.section.public_examples, self.cfg.seed)

    def ordered_batches(self, view: PublicView, tokenizer: Any) -> list[dict[str, torch.Tensor]]:
        return make_batches(
            view.examples,
            self.cfg.eval.batch_size,
            int(tokenizer.pad_token_id or 0),
            seed=0,
            bucketing=False,
            shuffle=False,
        )

    def knowledge(self, model: Any, tokenizer: Any, view: PublicView) -> Knowledge:
        losses, ids, values = public_knowledge(
            model, self.ordered_batches(view, tokenizer), self.section.top_k, len(tokenizer)
        )
        return Knowledge(losses, ids, values)

    # ----- client ------------------------------------------------------------------------------------
    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit, "distill": self._distill, PERSONAL_EVAL: self._evaluate_personal}

    def _own(self, ctx: ClientContext) -> tuple[Any, Any, ModelSpec]:
        spec = self.client_model_spec(ctx.client_id)
        model, tokenizer, initial = self.lora(ctx.resources, spec)
        load_adapter(model, ctx.state.get("adapter", initial))
        return model, tokenizer, spec

    def _examples(self, ctx: ClientContext, tokenizer: Any) -> list[Example]:
        data = self.cfg.data
        return ctx.resources.get(
            f"fedmkt/examples/{ctx.client_id}",
            lambda: encode_records(ctx.data, tokenizer, data.template, data.max_length),
        )

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Alg. 1 lines 3-6: E epochs on the private data, then loss and top-k on the public set."""
        model, tokenizer, spec = self._own(ctx)
        params = adapter_parameters(model)
        examples = self._examples(ctx, tokenizer)
        result = train_selected(ctx, model, params, examples, pad_token_id=int(tokenizer.pad_token_id or 0))
        ctx.state["adapter"] = dict(adapter_arrays(model))
        reply: Payload = dict(fit_scalars(ctx, result))
        if self.section.slm_fedavg:
            reply.update({ADAPTER + k: v for k, v in ctx.state["adapter"].items()})
        if self.cfg.fed.mode == "federated":
            knowledge = self.knowledge(
                model, tokenizer, self.view(ctx.resources, spec, self.public(ctx.public))
            )
            ctx.state["public_loss"] = knowledge.losses
            reply.update(knowledge.pack(PUBLIC, len(tokenizer), compress=self.section.compress))
        return reply

    def _distill(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Alg. 1 lines 13-16: align the LLM's knowledge, keep samples it predicts better, train."""
        if arrays(msg, ADAPTER):
            ctx.state["adapter"] = {
                k: np.asarray(v, dtype=np.float32) for k, v in arrays(msg, ADAPTER).items()
            }
        model, tokenizer, spec = self._own(ctx)
        if "public_loss" not in ctx.state:
            raise ValueError(f"client {ctx.client_id} got the LLM's knowledge before computing its own")
        records = self.public(ctx.public)
        llm_spec = self.server_model_spec()
        llm_view = self.view(ctx.resources, llm_spec, records)
        llm_knowledge = unpack_knowledge(
            msg, LLM, llm_view.counts, len(ctx.resources.tokenizer(llm_spec)), self.section.top_k
        )
        teachers = self.transfer_rows(ctx.resources, llm_knowledge, llm_spec, spec, records)
        selected = dual_min_ce(llm_knowledge.losses[None, :], ctx.state["public_loss"]) != NOT_SELECTED
        result, stats = self._train_mixed(
            ctx, model, tokenizer, self.view(ctx.resources, spec, records), teachers, selected
        )
        ctx.state["adapter"] = dict(adapter_arrays(model))
        return {"kd_selected": int(selected.sum()), "kd_loss": float(result.loss), **stats}

    def _train_mixed(
        self,
        ctx: ClientContext,
        model: Any,
        tokenizer: Any,
        view: PublicView,
        teachers: list[Teacher],
        selected: np.ndarray,
    ) -> tuple[Any, dict[str, float]]:
        train = self.cfg.train
        seed = derive_seed(self.cfg.seed, ctx.rnd, ctx.client_id, "fedmkt-kd")
        batches = kd_batches(
            view.examples,
            teachers,
            selected,
            train,
            int(tokenizer.pad_token_id or 0),
            seed=seed,
        )
        stats: dict[str, float] = {}
        result = train_selected(
            ctx,
            model,
            adapter_parameters(model),
            [],
            pad_token_id=0,
            batches=batches,
            loss_fn=mixed_loss_fn(self.section.lam, stats),
        )
        return result, {"kd_ce_sum": stats.get("ce", 0.0), "kd_sum": stats.get("kd", 0.0)}

    def _evaluate_personal(self, ctx: ClientContext, msg: Payload) -> Payload:
        records = evaluation_records(ctx, "") if self.section.slm_eval == "test" else ctx.eval_data
        if not records:
            raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout)")
        model, tokenizer, _ = self._own(ctx)
        rnd = int(msg["round"])
        result = evaluate_model(ctx.cfg, model, tokenizer, records, rnd)
        return personal_reply(result, len(records), rnd)

    # ----- server ------------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        self._resources = server.resources
        _, _, initial = self.lora(server.resources, self.server_model_spec())
        if not self.llm_adapter:
            self.llm_adapter = dict(initial)
        if self.section.slm_fedavg:
            keys = {self.client_model_spec(c).key for c in server.client_sizes}
            if len(keys) > 1:
                raise ValueError(
                    "fedmkt.slm_fedavg averages the clients' LoRA: every client must hold the same SLM"
                )

    def _fit_specs(
        self, server: ServerContext, clients: Sequence[str], fed: Federation
    ) -> dict[str, ReplySpec]:
        records = self.public(server.public_records)
        specs = {}
        for client in clients:
            spec = self.client_model_spec(client)
            expected: dict[str, ArraySpec] = {}
            if self.cfg.fed.mode == "federated":
                view = self.view(server.resources, spec, records)
                vocab = len(server.resources.tokenizer(spec))
                expected.update(
                    knowledge_spec(
                        PUBLIC, view.counts, self.section.top_k, vocab, compress=self.section.compress
                    )
                )
            if self.section.slm_fedavg:
                _, _, initial = self.lora(server.resources, spec)
                expected.update({ADAPTER + k: ArraySpec(v.shape, "float32") for k, v in initial.items()})
            # Deflated top-k has no fixed size: the extra arrays are checked when unpacked.
            compressed = self.cfg.fed.mode == "federated" and self.section.compress
            specs[client] = ReplySpec(
                expected, REPLY_SCALARS, allow_extra=compressed, example_limits=fed.client_sizes
            )
        return specs

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        sampled = fed.sample(self.clients_per_round(fed), rnd)
        expect = self._fit_specs(server, sampled, fed)
        message: Payload = {"round": rnd}
        replies = fed.call(sampled, "fit", message, timeout=self.cfg.fed.client_timeout, expect=expect)
        self.require_replies(replies, sampled, fed.traffic)
        extra: dict[str, float] = {}
        if self.cfg.fed.mode == "federated":
            extra = self._transfer(rnd, server, fed, replies)
        replies = {c: r for c, r in replies.items() if c not in fed.traffic.rejected}
        self.require_replies(replies, sampled, fed.traffic)
        weights = [int(r["num_examples"]) for r in replies.values()]
        return fit_round_result(sampled, replies, weights, extra)

    def _client_knowledge(
        self,
        server: ServerContext,
        fed: Federation,
        replies: Mapping[str, Payload],
        records: Sequence[Record],
    ) -> dict[str, list[Teacher] | Knowledge]:
        """Each replying client's knowledge (rejected when malformed) and its rows on the LLM's tokens."""
        llm_spec = self.server_model_spec()
        found: dict[str, Any] = {}
        for client, reply in replies.items():
            spec = self.client_model_spec(client)
            stray = [
                k
                for k, v in reply.items()
                if isinstance(v, np.ndarray) and not k.startswith((PUBLIC, ADAPTER))
            ]
            if stray:
                fed.traffic.rejected[client] = f"unexpected arrays: {', '.join(sorted(stray)[:5])}"
                continue
            view = self.view(server.resources, spec, records)
            try:
                knowledge = unpack_knowledge(
                    reply, PUBLIC, view.counts, len(server.resources.tokenizer(spec)), self.section.top_k
                )
            except ValueError as exc:
                fed.traffic.rejected[client] = str(exc)
                continue
            found[client] = (
                knowledge,
                self.transfer_rows(server.resources, knowledge, spec, llm_spec, records),
            )
        return found

    def _transfer(
        self, rnd: int, server: ServerContext, fed: Federation, replies: Mapping[str, Payload]
    ) -> dict[str, float]:
        """Alg. 1 lines 7-12 (server) and the clients' distillation."""
        records = self.public(server.public_records)
        llm_spec = self.server_model_spec()
        model, tokenizer, _ = self.lora(server.resources, llm_spec)
        load_adapter(model, self.llm_adapter)
        view = self.view(server.resources, llm_spec, records)
        stats: dict[str, float] = {}
        if self.section.llm_learns:
            found = self._client_knowledge(server, fed, replies, records)
            if found:
                stats.update(self._train_llm(rnd, server, model, tokenizer, view, found))
        llm_knowledge = self.knowledge(model, tokenizer, view)
        if not self.section.slm_learns:
            return stats
        message: Payload = {
            "round": rnd,
            **llm_knowledge.pack(LLM, len(tokenizer), compress=self.section.compress),
        }
        trained = [c for c in replies if c not in fed.traffic.rejected]
        if self.section.slm_fedavg:
            adapters = [arrays(replies[c], ADAPTER) for c in trained]
            average = weighted_average(adapters, [int(replies[c]["num_examples"]) for c in trained])
            message.update({ADAPTER + k: v for k, v in average.items()})
        kd = fed.call(
            trained,
            "distill",
            message,
            timeout=self.cfg.fed.client_timeout,
            expect=ReplySpec({}, KD_SCALARS, allow_extra=True),
        )
        if kd:
            stats["slm_kd_selected"] = float(np.mean([int(r["kd_selected"]) for r in kd.values()]))
            stats["slm_kd_loss"] = float(np.mean([float(r["kd_loss"]) for r in kd.values()]))
        return stats

    def _train_llm(
        self,
        rnd: int,
        server: ServerContext,
        model: Any,
        tokenizer: Any,
        view: PublicView,
        found: Mapping[str, Any],
    ) -> dict[str, float]:
        """DualMinCE over the clients' knowledge, then ``lam CE + (1 - lam) KD`` on the LLM's LoRA."""
        clients = list(found)
        local = self.knowledge(model, tokenizer, view).losses
        choice = dual_min_ce(np.stack([found[c][0].losses for c in clients]), local)
        teachers: list[Teacher] = []
        for sample, chosen in enumerate(choice):
            if chosen == NOT_SELECTED:
                positions = len(view.positions[sample])
                teachers.append(
                    (
                        np.full((positions, 1), -1, dtype=np.int64),
                        np.full((positions, 1), -np.inf, dtype=np.float32),
                    )
                )
            else:
                teachers.append(found[clients[chosen]][1][sample])
        settings = self.section.llm_train
        seed = derive_seed(self.cfg.seed, rnd, "fedmkt-llm")
        batches = kd_batches(
            view.examples,
            teachers,
            choice != NOT_SELECTED,
            settings,
            int(tokenizer.pad_token_id or 0),
            seed=seed,
        )
        sums: dict[str, float] = {}
        result = local_sft(
            model,
            [],
            settings,
            pad_token_id=0,
            seed=seed,
            rnd=rnd,
            rounds=self.cfg.fed.rounds,
            report=server.report,
            trainable=adapter_parameters(model),
            batches=batches,
            loss_fn=mixed_loss_fn(self.section.lam, sums),
        )
        self.llm_adapter = dict(adapter_arrays(model))
        return {
            "llm_kd_selected": float((choice != NOT_SELECTED).sum()),
            "llm_loss": float(result.loss),
            "kd_seconds": float(result.seconds),
        }

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """The LLM (with its LoRA) on the test set; the SLMs are evaluated by their clients."""
        model, tokenizer, _ = self.lora(server.resources, self.server_model_spec())
        load_adapter(model, self.llm_adapter)
        return evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        message: Payload = {"round": rnd}
        return message

    def write_artifacts(self, directory: Path) -> None:
        """The LLM's final LoRA as a peft adapter (``fedtune eval`` / ``generate``); the SLMs' LoRA never
        leave their clients."""
        model, _, _ = self.lora(self._resources, self.server_model_spec())
        load_adapter(model, self.llm_adapter)
        model.save_pretrained(str(directory / "adapter"))
        meta = {"base_model": self.cfg.model.name, "template": self.cfg.data.template, "algorithm": self.name}
        (directory / "meta.json").write_text(json.dumps(meta, indent=1))

    def state_dict(self) -> dict[str, Any]:
        return {"llm_adapter": self.llm_adapter}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.llm_adapter = {k: np.asarray(v) for k, v in state["llm_adapter"].items()}
