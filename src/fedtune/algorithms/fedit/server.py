"""FedIT's rounds: FedAvg (server step, FedProx) of LoRA adapters, standalone and centralized modes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import fedtune.algorithms.fedit.client as client
from fedtune.algorithms.adapters import ADAPTER, collect_adapters, evaluate_adapter, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.fedit.config import FedITConfig
from fedtune.algorithms.personal import PERSONAL_EVAL
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet, mean_results, payload_result
from fedtune.fl.aggregate import server_step
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays


class FedIT(Algorithm[FedITConfig]):
    name = "fedit"
    Config = FedITConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.holders: set[str] = set()  # standalone: the clients that hold a personal adapter

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": client.fit, "evaluate": client.evaluate_own, PERSONAL_EVAL: client.evaluate_personal}

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
            adapters = [arrays(r, ADAPTER) for r in replies.values()]
            average = self.aggregate(adapters, weights, reference=self.global_adapter)
            self.global_adapter = server_step(self.global_adapter, average, self.section.server_lr)
            return fit_round_result(sampled, replies, weights)
        # Standalone: only a client that holds no adapter yet is sent the initial one.
        sampled = self.sample_clients(fed, rnd)
        messages = {cid: {} if cid in self.holders else self._broadcast() for cid in sampled}
        sampled, replies, weights = collect_adapters(
            self, fed, rnd, self.global_adapter, messages, reference=False, sampled=sampled
        )
        self.holders.update(replies)
        return fit_round_result(sampled, replies, weights)

    def _broadcast(self) -> Payload:
        return {ADAPTER + k: v for k, v in self.global_adapter.items()}

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        if self.cfg.fed.mode == "standalone" and rnd > 0 and self.holders:
            holders = [cid for cid in fed.client_ids() if cid in self.holders]
            message: Payload = {"eval_set": eval_set.name, "round": rnd}
            replies = fed.call(holders, "evaluate", message)
            if replies:
                return mean_results([payload_result(replies[cid]) for cid in holders if cid in replies])
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {"global_adapter": self.global_adapter, "holders": sorted(self.holders)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.holders = set(state.get("holders", []))
