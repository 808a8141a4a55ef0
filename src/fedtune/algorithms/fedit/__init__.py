"""FedIT: federated instruction tuning = FedAvg of LoRA adapters (Zhang et al.), with FedProx.

Round: sample clients; each loads the global adapter into the shared base model, runs E local
epochs of response-only SFT and returns its adapter and example count; the server averages
adapters weighted by example count and takes a server step (lr 1 = plain FedAvg).

Run modes (``fed.mode``): ``federated``; ``standalone`` (each client keeps and trains its own
adapter, nothing is aggregated; a client starts from the initial adapter the first time it is
sampled; evaluation is a client task -- each client evaluates its own adapter -- averaged over the
clients that hold one); ``centralized`` (the runner gives the union of client data to a single
client).

Layout: ``config`` (the ``fedit:`` section), ``client`` (the client tasks), ``server`` (the rounds).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedit.config import FedITConfig
    from fedtune.algorithms.fedit.server import FedIT

__all__ = ["FedIT", "FedITConfig"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {"FedIT": "fedtune.algorithms.fedit.server", "FedITConfig": "fedtune.algorithms.fedit.config"},
)
