"""FedYogi: the shared adaptive rounds (``fedopt.server.FedOpt``) with the yogi second moment."""

from __future__ import annotations

from fedtune.algorithms.fedopt.server import FedOpt
from fedtune.algorithms.fedyogi.config import FedYogiConfig


class FedYogi(FedOpt[FedYogiConfig]):
    name = "fedyogi"
    Config = FedYogiConfig
    optimiser = "yogi"
