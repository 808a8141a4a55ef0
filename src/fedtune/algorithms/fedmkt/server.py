"""FedMKT's server: the LLM learns from the clients' knowledge of the public set and teaches them back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fedtune.algorithms.fedmkt.client as client
from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed, evaluate_model
from fedtune.algorithms.fedmkt.config import FedMKTConfig
from fedtune.algorithms.fedmkt.final import CLIENT_OPTION, slm_model
from fedtune.algorithms.fedmkt.transfer import (
    NOT_SELECTED,
    PublicView,
    Teacher,
    dual_min_ce,
    kd_batches,
    mixed_loss_fn,
    selected_teachers,
)
from fedtune.algorithms.fedmkt.wire import (
    ADAPTER,
    KD_SCALARS,
    LLM,
    PUBLIC,
    Knowledge,
    knowledge_spec,
    unpack_knowledge,
)
from fedtune.algorithms.final import FinalModel, FinalRun
from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.algorithms.personal import PERSONAL_EVAL
from fedtune.config import ConfigError, ExperimentConfig
from fedtune.data.records import Record
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ArraySpec, ReplySpec
from fedtune.models.loading import ModelError
from fedtune.models.lora import adapter_arrays, adapter_parameters, load_adapter
from fedtune.models.spec import ModelSpec
from fedtune.resources import Resources
from fedtune.train.sft import local_sft

Found = tuple[Knowledge, list[Teacher]]
"""A client's knowledge of the public set, and its rows on the LLM's response tokens."""


class FedMKT(Algorithm[FedMKTConfig]):
    name = "fedmkt"
    Config = FedMKTConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.llm_adapter: dict[str, np.ndarray] = {}
        # With slm_fedavg: the last LoRA average sent to the clients, the reference their next
        # uploads are measured against (fed.norm_bound, fed.screen); before any, the shared init.
        self.slm_average: dict[str, np.ndarray] = {}

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": client.fit, "distill": client.distill, PERSONAL_EVAL: client.evaluate_personal}

    def client_model_spec(self, client_id: str) -> ModelSpec:
        return client.slm_spec(self.cfg, client_id)

    def _llm(self, resources: Resources) -> tuple[Any, Any]:
        """The LLM with its LoRA (the current ``llm_adapter`` loaded) and its tokenizer."""
        model, tokenizer, _ = client.lora_model(self.cfg, resources, self.server_model_spec())
        load_adapter(model, self.llm_adapter)
        return model, tokenizer

    # ----- setup and round -------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        self._resources = server.resources
        for spec in {self.server_model_spec(), *(self.client_model_spec(c) for c in server.client_sizes)}:
            vocab = self._vocabulary(server, spec)
            if self.section.top_k > vocab:
                raise ConfigError(
                    f"fedmkt.top_k {self.section.top_k} exceeds the {vocab}-token vocabulary of {spec.name}: "
                    f"set fedmkt.top_k <= {vocab}"
                )
        _, _, initial = client.lora_model(self.cfg, server.resources, self.server_model_spec())
        if not self.llm_adapter:
            self.llm_adapter = dict(initial)
        if self.section.slm_fedavg:
            keys = {self.client_model_spec(c).key for c in server.client_sizes}
            if len(keys) > 1:
                raise ValueError(
                    "fedmkt.slm_fedavg averages the clients' LoRA: every client must hold the same SLM"
                )

    def _vocabulary(self, server: ServerContext, spec: ModelSpec) -> int:
        """``spec``'s vocabulary size; a model that cannot be found names the config key that chose it."""
        try:
            return server.resources.vocab_size(spec)
        except ModelError as exc:
            keys = [
                f"fedmkt.clients[{i}]" for i, name in enumerate(self.section.clients) if name == spec.name
            ]
            raise ConfigError(f"{', '.join(keys) or 'model.name'}: {exc}") from None

    def _fit_specs(
        self, server: ServerContext, clients: Sequence[str], fed: Federation
    ) -> dict[str, ReplySpec]:
        records = client.public_records(self.cfg, server.public_records)
        federated = self.cfg.fed.mode == "federated"
        specs = {}
        for client_id in clients:
            spec = self.client_model_spec(client_id)
            expected: dict[str, ArraySpec] = {}
            if federated:
                counts = client.public_view_of(self.cfg, server.resources, spec, records).counts
                vocab = server.resources.vocab_size(spec)
                top_k, compress = self.section.top_k, self.section.compress
                expected.update(knowledge_spec(PUBLIC, counts, top_k, vocab, compress=compress))
            reference: dict[str, np.ndarray] | None = None
            if self.cfg.fed.mode == "centralized":
                # The one party replies with the adapter it was sent, trained: measured from that one.
                expected.update(
                    {ADAPTER + k: ArraySpec(v.shape, "float32") for k, v in self.llm_adapter.items()}
                )
                reference = {ADAPTER + k: v for k, v in self.llm_adapter.items()}
            elif self.section.slm_fedavg:
                _, _, initial = client.lora_model(self.cfg, server.resources, spec)
                expected.update({ADAPTER + k: ArraySpec(v.shape, "float32") for k, v in initial.items()})
                # A client's LoRA is measured from the last average it was sent (a client that
                # missed recent rounds shows a longer, still legitimate, displacement).
                reference = {ADAPTER + k: v for k, v in (self.slm_average or initial).items()}
            # Deflated top-k has no fixed size: the extra arrays are checked when unpacked.
            compressed = federated and self.section.compress
            specs[client_id] = ReplySpec(
                expected,
                REPLY_SCALARS,
                norm_bound=self.cfg.fed.norm_bound if reference is not None else None,
                reference=reference,
                allow_extra=compressed,
                example_limits=fed.client_sizes,
            )
        return specs

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        sampled = self.sample_clients(fed, rnd)
        expect = self._fit_specs(server, sampled, fed)
        message: Payload = {"round": rnd}
        centralized = self.cfg.fed.mode == "centralized"
        if centralized:  # the Centralized baseline: the one party tunes the run's model
            message.update({ADAPTER + k: v for k, v in self.llm_adapter.items()})
        replies = fed.call(sampled, "fit", message, timeout=self.cfg.fed.client_timeout, expect=expect)
        self.require_replies(replies, sampled, fed.traffic)
        extra: dict[str, float] = {}
        if self.cfg.fed.mode == "federated":
            extra = self._transfer(rnd, server, fed, replies)
        if centralized:
            weights = [int(r["num_examples"]) for r in replies.values()]
            average = self.aggregate([arrays(r, ADAPTER) for r in replies.values()], weights)
            self.llm_adapter = {k: np.asarray(v, dtype=np.float32) for k, v in average.items()}
        replies = {c: r for c, r in replies.items() if c not in fed.traffic.rejected}
        self.require_replies(replies, sampled, fed.traffic)
        weights = [int(r["num_examples"]) for r in replies.values()]
        return fit_round_result(sampled, replies, weights, extra)

    # ----- knowledge transfer ----------------------------------------------------------------------
    def _client_knowledge(
        self,
        server: ServerContext,
        fed: Federation,
        replies: Mapping[str, Payload],
        records: Sequence[Record],
    ) -> dict[str, Found]:
        """Each replying client's knowledge (rejected when malformed) and its rows on the LLM's tokens."""
        llm_spec = self.server_model_spec()
        found: dict[str, Found] = {}
        for client_id, reply in replies.items():
            spec = self.client_model_spec(client_id)
            stray = [
                k
                for k, v in reply.items()
                if isinstance(v, np.ndarray) and not k.startswith((PUBLIC, ADAPTER))
            ]
            if stray:
                fed.traffic.rejected[client_id] = f"unexpected arrays: {', '.join(sorted(stray)[:5])}"
                continue
            counts = client.public_view_of(self.cfg, server.resources, spec, records).counts
            vocab = server.resources.vocab_size(spec)
            try:
                knowledge = unpack_knowledge(reply, PUBLIC, counts, vocab, self.section.top_k)
            except ValueError as exc:
                fed.traffic.rejected[client_id] = str(exc)
                continue
            rows = client.transfer_rows(self.cfg, server.resources, knowledge, spec, llm_spec, records)
            found[client_id] = (knowledge, rows)
        return found

    def _transfer(
        self, rnd: int, server: ServerContext, fed: Federation, replies: Mapping[str, Payload]
    ) -> dict[str, float]:
        """Alg. 1 lines 7-12 (server) and the clients' distillation."""
        records = client.public_records(self.cfg, server.public_records)
        model, tokenizer = self._llm(server.resources)
        view = client.public_view_of(self.cfg, server.resources, self.server_model_spec(), records)
        stats: dict[str, float] = {}
        if self.section.llm_learns:
            found = self._client_knowledge(server, fed, replies, records)
            if found:
                stats.update(self._train_llm(rnd, server, model, tokenizer, view, found))
        llm_knowledge = client.knowledge(self.cfg, model, tokenizer, view)
        if not self.section.slm_learns:
            return stats
        trained = [c for c in replies if c not in fed.traffic.rejected]
        kd = fed.call(
            trained,
            "distill",
            self._distill_message(rnd, llm_knowledge, len(tokenizer), replies, trained),
            timeout=self.cfg.fed.client_timeout,
            expect=ReplySpec({}, KD_SCALARS, allow_extra=True),
        )
        if kd:
            stats["slm_kd_selected"] = float(np.mean([int(r["kd_selected"]) for r in kd.values()]))
            stats["slm_kd_loss"] = float(np.mean([float(r["kd_loss"]) for r in kd.values()]))
        return stats

    def _distill_message(
        self,
        rnd: int,
        llm_knowledge: Knowledge,
        vocab: int,
        replies: Mapping[str, Payload],
        trained: list[str],
    ) -> Payload:
        """The LLM's knowledge, and with ``slm_fedavg`` the trained clients' LoRA averaged."""
        message: Payload = {"round": rnd, **llm_knowledge.pack(LLM, vocab, compress=self.section.compress)}
        if self.section.slm_fedavg:
            adapters = [arrays(replies[c], ADAPTER) for c in trained]
            average = self.aggregate(adapters, [int(replies[c]["num_examples"]) for c in trained])
            self.slm_average = dict(average)
            message.update({ADAPTER + k: v for k, v in average.items()})
        return message

    def _train_llm(
        self,
        rnd: int,
        server: ServerContext,
        model: Any,
        tokenizer: Any,
        view: PublicView,
        found: Mapping[str, Found],
    ) -> dict[str, float]:
        """DualMinCE over the clients' knowledge, then ``lam CE + (1 - lam) KD`` on the LLM's LoRA."""
        clients = list(found)
        local = client.knowledge(self.cfg, model, tokenizer, view).losses
        choice = dual_min_ce(np.stack([found[c][0].losses for c in clients]), local)
        teachers = selected_teachers(choice, [found[c][1] for c in clients], view.counts)
        settings = self.section.llm_train
        seed = derive_seed(self.cfg.seed, rnd, "fedmkt-llm")
        pad = int(tokenizer.pad_token_id or 0)
        batches = kd_batches(view.examples, teachers, choice != NOT_SELECTED, settings, pad, seed=seed)
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

    # ----- evaluation, final model, state ----------------------------------------------------------
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """The LLM (with its LoRA) on the test set; the SLMs are evaluated by their clients."""
        model, tokenizer = self._llm(server.resources)
        return evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        message: Payload = {"round": rnd}
        return message

    def write_artifacts(self, directory: Path) -> None:
        """The LLM's final LoRA as a peft adapter (``fedtune eval`` / ``generate``); the SLMs' LoRA never
        leave their clients (`final.slm_model` reads one from the clients' checkpointed state)."""
        from fedtune.modelcard import base_model_of, save_peft_adapter

        model, _ = self._llm(self._resources)
        save_peft_adapter(model, directory / "adapter", base_model_of(self.cfg.model))
        meta = {"base_model": self.cfg.model.name, "template": self.cfg.data.template, "algorithm": self.name}
        (directory / "meta.json").write_text(json.dumps(meta, indent=1))

    final_options = (CLIENT_OPTION,)

    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        """The LLM with its final LoRA; ``--option client=ID``: client ``ID``'s SLM with its own LoRA."""
        if CLIENT_OPTION in run.options:
            return slm_model(run)
        return super().final_model(run)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"llm_adapter": self.llm_adapter}
        if self.slm_average:
            state["slm_average"] = self.slm_average
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.llm_adapter = {k: np.asarray(v) for k, v in state["llm_adapter"].items()}
        self.slm_average = {k: np.asarray(v) for k, v in state.get("slm_average", {}).items()}
