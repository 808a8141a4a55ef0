"""FedYogi's config section (``fedyogi:``): the shared eta, tau and beta1, and beta2."""

from __future__ import annotations

from pydantic import Field

from fedtune.algorithms.fedopt.config import FedOptConfig


class FedYogiConfig(FedOptConfig):
    """FedYogi: v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)."""

    beta2: float = Field(0.99, ge=0, lt=1)
    """Second-moment rate: v_t = v_{t-1} - (1 - beta2) * Delta_t^2 * sign(v_{t-1} - Delta_t^2)."""
