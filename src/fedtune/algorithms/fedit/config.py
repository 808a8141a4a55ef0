"""FedIT's config section (``fedit:``)."""

from __future__ import annotations

from pydantic import Field

from fedtune.config import AlgorithmConfig


class FedITConfig(AlgorithmConfig):
    """FedIT = FedAvg of LoRA states weighted by example count; FedProx when ``prox_mu > 0``."""

    modes = ("federated", "standalone", "centralized")
    personal_eval = True
    dp_refused = None  # every client-dependent change of the model goes through Algorithm.aggregate

    prox_mu: float = Field(0.0, ge=0)
    """0: FedAvg; > 0: FedProx's proximal term mu/2 ||w - w_t||^2."""
    server_lr: float = Field(1.0, gt=0)
    """The server step on the averaged update (1: plain FedAvg)."""
