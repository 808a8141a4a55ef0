"""FedAdam: the shared adaptive rounds (``fedopt.server.FedOpt``) with the adam second moment."""

from __future__ import annotations

from fedtune.algorithms.fedadam.config import FedAdamConfig
from fedtune.algorithms.fedopt.server import FedOpt


class FedAdam(FedOpt[FedAdamConfig]):
    name = "fedadam"
    Config = FedAdamConfig
    optimiser = "adam"
