"""FedAvgM: FedAvg with server momentum on the LoRA adapter (Hsu, Qi and Brown, 2019).

The worked example of docs/adding-a-method.md: one config class, one pure function for the
maths, one small class that reuses FedIT's client task and helpers. Round t: the sampled clients
train the global adapter x_t locally (FedIT's ``fit`` task); the server averages their adapters
weighted by example count, then takes a momentum step on the pseudo-gradient

    g_t = x_t - avg_t;   v_t = beta * v_{t-1} + g_t;   x_{t+1} = x_t - lr * v_t

With ``momentum: 0`` and ``server_lr: 1`` this is exactly FedIT (FedAvg).

Layout: ``config`` (the ``fedavgm:`` section), ``maths`` (the momentum step), ``server`` (the rounds).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedavgm.config import FedAvgMConfig
    from fedtune.algorithms.fedavgm.maths import momentum_step
    from fedtune.algorithms.fedavgm.server import FedAvgM

__all__ = ["FedAvgM", "FedAvgMConfig", "momentum_step"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedAvgM": "fedtune.algorithms.fedavgm.server",
        "FedAvgMConfig": "fedtune.algorithms.fedavgm.config",
        "momentum_step": "fedtune.algorithms.fedavgm.maths",
    },
)
