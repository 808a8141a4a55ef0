"""FedAvgM: FedAvg with server momentum on the LoRA adapter (Hsu, Qi and Brown, 2019).

The worked example of docs/adding-a-method.md: one config class, one pure function for the
maths, one small class that reuses FedIT's client task and helpers. Round t: the sampled clients
train the global adapter x_t locally (FedIT's ``fit`` task); the server averages their adapters
weighted by example count, then takes a momentum step on the pseudo-gradient

    g_t = x_t - avg_t;   v_t = beta * v_{t-1} + g_t;   x_{t+1} = x_t - lr * v_t

With ``momentum: 0`` and ``server_lr: 1`` this is exactly FedIT (FedAvg).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from fedtune.algorithms.adapters import (
    ADAPTER,
    collect_adapters,
    evaluate_adapter,
    fit_adapter,
    fit_round_result,
)
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.config import AlgorithmConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays


class FedAvgMConfig(AlgorithmConfig):
    """Server momentum ``momentum`` (beta) and server learning rate ``server_lr``."""

    dp_refused = None  # every client-dependent change of the model goes through Algorithm.aggregate

    momentum: float = Field(0.9, ge=0, lt=1)
    server_lr: float = Field(1.0, gt=0)


def momentum_step(
    current: Mapping[str, np.ndarray],
    average: Mapping[str, np.ndarray],
    velocity: Mapping[str, np.ndarray],
    *,
    lr: float,
    momentum: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One server step; returns ``(x_{t+1}, v_t)``. All arrays keyed alike; float64 maths, dtypes kept."""
    new_state, new_velocity = {}, {}
    for key, x in current.items():
        pseudo_gradient = x.astype(np.float64) - average[key].astype(np.float64)
        v = momentum * velocity[key].astype(np.float64) + pseudo_gradient
        new_velocity[key] = v.astype(x.dtype)
        new_state[key] = (x.astype(np.float64) - lr * v).astype(x.dtype)
    return new_state, new_velocity


class FedAvgM(Algorithm[FedAvgMConfig]):
    name = "fedavgm"
    Config = FedAvgMConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.velocity: dict[str, np.ndarray] = {}

    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit}

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)

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
