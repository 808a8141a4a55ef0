"""FedAvgM's config section (``fedavgm:``)."""

from __future__ import annotations

from pydantic import Field

from fedtune.config import AlgorithmConfig


class FedAvgMConfig(AlgorithmConfig):
    """Server momentum ``momentum`` (beta) and server learning rate ``server_lr``."""

    dp_refused = None  # every client-dependent change of the model goes through Algorithm.aggregate

    momentum: float = Field(0.9, ge=0, lt=1)
    """Server momentum beta."""
    server_lr: float = Field(1.0, gt=0)
    """Server learning rate."""
