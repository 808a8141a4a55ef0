"""FedAdam's config section (``fedadam:``): the shared eta, tau and beta1, and beta2."""

from __future__ import annotations

from pydantic import Field

from fedtune.algorithms.fedopt.config import FedOptConfig


class FedAdamConfig(FedOptConfig):
    """FedAdam: v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2 (no bias correction)."""

    beta2: float = Field(0.99, ge=0, lt=1)
    """Second-moment decay: v_t = beta2 * v_{t-1} + (1 - beta2) * Delta_t^2."""
