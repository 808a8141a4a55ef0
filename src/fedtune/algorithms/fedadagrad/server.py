"""FedAdagrad: the shared adaptive rounds (``fedopt.server.FedOpt``) with the adagrad second moment."""

from __future__ import annotations

from fedtune.algorithms.fedadagrad.config import FedAdagradConfig
from fedtune.algorithms.fedopt.server import FedOpt


class FedAdagrad(FedOpt[FedAdagradConfig]):
    name = "fedadagrad"
    Config = FedAdagradConfig
    optimiser = "adagrad"
