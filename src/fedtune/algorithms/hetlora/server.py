"""HetLoRA's rounds: clients at their own ranks, rank self-pruning applied to their replies, and the
sparsity-weighted mean of the zero-padded adapters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import fedtune.algorithms.hetlora.client as client
from fedtune.algorithms.adapters import ADAPTER, evaluate_adapter, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.hetlora.config import HetLoRAConfig
from fedtune.algorithms.hetlora.maths import prunes, sparsity_weighted_mean, tail_norm, tail_start
from fedtune.algorithms.hetrank.maths import truncate, zero_pad
from fedtune.algorithms.hetrank.server import checked_ranks, client_ranks, collect_at_ranks
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import arrays


class HetLoRA(Algorithm[HetLoRAConfig]):
    name = "hetlora"
    Config = HetLoRAConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.rank_list = checked_ranks(cfg, "hetlora", self.section.ranks)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.ranks: dict[str, int] = {}  # every client's current rank (lowered by pruning)
        self.tail_norms: dict[str, float] = {}  # each client's tail norm in the last reply at its rank

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": client.fit}

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        if not self.ranks:
            self.ranks = client_ranks(fed, self.rank_list)
        sampled, replies, weights = collect_at_ranks(self, fed, rnd, self.global_adapter, self.ranks)
        adapters = [self._self_pruned(cid, arrays(reply, ADAPTER)) for cid, reply in replies.items()]
        if adapters:
            self.global_adapter = self._combine(adapters, weights)
        mean_rank = float(np.mean([self.ranks[cid] for cid in sampled])) if sampled else 0.0
        return fit_round_result(sampled, replies, weights, {"mean_client_rank": mean_rank})

    def _self_pruned(self, client_id: str, adapter: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``adapter`` as its client keeps it: without its tail once the tail's norm fell below the
        client's previous round's (then the client's rank is lowered for the rounds to come)."""
        rank = self.ranks[client_id]
        start = tail_start(rank, self.section.gamma, self.section.min_rank)
        if not self.section.prune or start >= rank:
            return adapter
        norm = tail_norm(adapter, start, rank)
        if prunes(self.tail_norms.get(client_id), norm):
            self.ranks[client_id] = start
            self.tail_norms.pop(client_id, None)
            return truncate(adapter, start)
        self.tail_norms[client_id] = norm
        return adapter

    def _combine(self, adapters: list[dict[str, np.ndarray]], weights: list[int]) -> dict[str, np.ndarray]:
        """Sparsity-weighted mean; a robust ``fed.aggregator``: that rule over the padded adapters."""
        full_rank = self.cfg.lora.r
        if self.cfg.fed.aggregator == "mean":
            return sparsity_weighted_mean(adapters, full_rank)
        return self.aggregate([zero_pad(adapter, full_rank) for adapter in adapters], weights)

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_adapter": self.global_adapter,
            "ranks": dict(self.ranks),
            "tail_norms": dict(self.tail_norms),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.ranks = {str(k): int(v) for k, v in state["ranks"].items()}
        self.tail_norms = {str(k): float(v) for k, v in state["tail_norms"].items()}
