"""FlexLoRA's rounds: clients at their own ranks, the data-weighted mean of their full-size products,
redistributed by truncated SVD."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import fedtune.algorithms.flexlora.client as client
from fedtune.algorithms.adapters import ADAPTER, evaluate_adapter, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.flexlora.config import FlexLoRAConfig
from fedtune.algorithms.flexlora.maths import product_mean, svd_factors
from fedtune.algorithms.hetrank.maths import products
from fedtune.algorithms.hetrank.server import checked_ranks, client_ranks, collect_at_ranks
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import arrays


class FlexLoRA(Algorithm[FlexLoRAConfig]):
    name = "flexlora"
    Config = FlexLoRAConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.rank_list = checked_ranks(cfg, "flexlora", self.section.ranks)
        self.ranks: dict[str, int] = {}
        # The global adapter at lora.r: the initial one, then the rank-lora.r SVD factors of the mean.
        self.global_adapter: dict[str, np.ndarray] = {}
        # The full-size aggregate W per module, the global model itself (the adapter is its truncation).
        self.global_products: dict[str, np.ndarray] = {}

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": client.fit}

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        if not self.ranks:
            self.ranks = client_ranks(fed, self.rank_list)
        sampled, replies, weights = collect_at_ranks(self, fed, rnd, self.global_adapter, self.ranks)
        if replies:
            adapters = [arrays(reply, ADAPTER) for reply in replies.values()]
            self.global_products = self._combine(adapters, weights)
            keys = list(self.global_adapter)
            self.global_adapter = svd_factors(self.global_products, keys, self.cfg.lora.r)
        return fit_round_result(sampled, replies, weights)

    def _combine(self, adapters: list[dict[str, np.ndarray]], weights: list[int]) -> dict[str, np.ndarray]:
        """The data-weighted mean of the products; under a robust ``fed.aggregator`` that rule over them."""
        if self.cfg.fed.aggregator == "mean":
            return product_mean(adapters, weights)
        return self.aggregate([products(adapter) for adapter in adapters], weights)

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_adapter": self.global_adapter,
            "global_products": self.global_products,
            "ranks": dict(self.ranks),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.global_products = {k: np.asarray(v) for k, v in state["global_products"].items()}
        self.ranks = {str(k): int(v) for k, v in state["ranks"].items()}
