"""FedAvgM's rounds: FedIT's client task, then a momentum step on the averaged adapter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedtune.algorithms.adapters import (
    ADAPTER,
    collect_adapters,
    evaluate_adapter,
    fit_adapter,
    fit_round_result,
)
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.fedavgm.config import FedAvgMConfig
from fedtune.algorithms.fedavgm.maths import momentum_step
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """FedIT's client task without a proximal term: train the adapter ``adapter/*`` of ``msg`` locally."""
    return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)


class FedAvgM(Algorithm[FedAvgMConfig]):
    name = "fedavgm"
    Config = FedAvgMConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.velocity: dict[str, np.ndarray] = {}

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": fit}

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())
        self.velocity = {key: np.zeros_like(value) for key, value in self.global_adapter.items()}

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        message: Payload = {ADAPTER + key: value for key, value in self.global_adapter.items()}
        sampled, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, message)
        adapters = [arrays(reply, ADAPTER) for reply in replies.values()]
        average = self.aggregate(adapters, weights, reference=self.global_adapter)
        self.global_adapter, self.velocity = momentum_step(
            self.global_adapter,
            average,
            self.velocity,
            lr=self.section.server_lr,
            momentum=self.section.momentum,
        )
        return fit_round_result(sampled, replies, weights)

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {"global_adapter": self.global_adapter, "velocity": self.velocity}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.velocity = {k: np.asarray(v) for k, v in state["velocity"].items()}
