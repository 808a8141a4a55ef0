"""What the config sections of the adaptive server optimisers share (``fedadam:``, ``fedyogi:``,
``fedadagrad:`` subclass it).

Defaults: beta1 = 0.9, beta2 = 0.99 and tau = 1e-3 are the values of Reddi et al.'s main experiments
(they grid-search the client and server learning rates per task on log grids and study tau apart).
server_lr = 0.01 is a starting point, not a tuned value (Flower's FedYogi default, with its tau = 1e-3;
Flower's FedAdam and FedAdagrad default to server_lr = 0.1, tau = 1e-9, where the first steps move
every entry by about server_lr).
"""

from __future__ import annotations

from pydantic import Field

from fedtune.config import AlgorithmConfig


class FedOptConfig(AlgorithmConfig):
    """What the three optimisers share: eta (``server_lr``), tau and beta1."""

    dp_refused = None  # the optimiser only post-processes Algorithm.aggregate's release

    server_lr: float = Field(0.01, gt=0)
    """Server learning rate eta: x_{t+1} = x_t + eta * m_t / (sqrt(v_t) + tau)."""
    tau: float = Field(1e-3, gt=0)
    """Adaptivity tau: added to sqrt(v_t), and v starts at tau^2 (larger: closer to momentum SGD)."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """First-moment decay: m_t = beta1 * m_{t-1} + (1 - beta1) * Delta_t (0: no server momentum)."""
