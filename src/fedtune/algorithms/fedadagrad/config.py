"""FedAdagrad's config section (``fedadagrad:``): the shared eta, tau and beta1 (Adagrad has no beta2)."""

from __future__ import annotations

from fedtune.algorithms.fedopt.config import FedOptConfig


class FedAdagradConfig(FedOptConfig):
    """FedAdagrad: v_t = v_{t-1} + Delta_t^2."""
