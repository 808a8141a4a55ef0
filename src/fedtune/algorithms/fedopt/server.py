"""The rounds of FedAdagrad, FedAdam and FedYogi: FedIT's clients, then an adaptive step on the release.

One class holds the rounds; each optimiser's package subclasses it, naming the method, its config
section and its second-moment rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from fedtune.algorithms.adapters import ADAPTER, collect_adapters, evaluate_adapter, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.fedopt.client import fit
from fedtune.algorithms.fedopt.config import FedOptConfig
from fedtune.algorithms.fedopt.maths import (
    SECOND_MOMENTS,
    adaptive_step,
    initial_moments,
)
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays

ConfigT = TypeVar("ConfigT", bound=FedOptConfig)


class FedOpt(Algorithm[ConfigT]):
    """Algorithm 2 of Reddi et al.: the released mean of the clients' adapters is a pseudo-gradient
    for a server optimiser whose moments (``first_moment``, ``second_moment``) persist across rounds."""

    optimiser: ClassVar[str]
    """The second-moment rule, a key of ``maths.SECOND_MOMENTS``."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.first_moment: dict[str, np.ndarray] = {}
        self.second_moment: dict[str, np.ndarray] = {}

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": fit}

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = dict(server.resources.initial_adapter())
        self.first_moment, self.second_moment = initial_moments(self.global_adapter, self.section.tau)

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        message: Payload = {ADAPTER + key: value for key, value in self.global_adapter.items()}
        sampled, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, message)
        adapters = [arrays(reply, ADAPTER) for reply in replies.values()]
        # x_t + Delta_t: the weighted mean, or under dp / secagg the release of it.
        released = self.aggregate(adapters, weights, reference=self.global_adapter)
        section = self.section
        self.global_adapter, self.first_moment, self.second_moment = adaptive_step(
            self.global_adapter,
            released,
            self.first_moment,
            self.second_moment,
            second_moment=SECOND_MOMENTS[self.optimiser],
            server_lr=section.server_lr,
            tau=section.tau,
            beta1=section.beta1,
            beta2=float(getattr(section, "beta2", 0.0)),
        )
        return fit_round_result(sampled, replies, weights)

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_adapter": self.global_adapter,
            "first_moment": self.first_moment,
            "second_moment": self.second_moment,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.first_moment = {k: np.asarray(v) for k, v in state["first_moment"].items()}
        self.second_moment = {k: np.asarray(v) for k, v in state["second_moment"].items()}
