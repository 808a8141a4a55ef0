"""FedAdagrad: Adagrad on the server (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2).

FedIT's clients train the global LoRA adapter x_t; the server steps on Delta_t = (released mean) - x_t:

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t;
    v_t = v_{t-1} + Delta_t^2;
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau),   m_{-1} = 0, v_{-1} = tau^2.

beta1 is kept, as in Algorithm 2 (Flower's FedAdagrad fixes it at 0: set ``fedadagrad.beta1=0``).
The rounds, the step and the deviations shared with the other two optimisers are in
``fedtune.algorithms.fedopt``; this package names the method, its config section and its v update.

Layout: ``config`` (the ``fedadagrad:`` section), ``server`` (the class).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedadagrad.config import FedAdagradConfig
    from fedtune.algorithms.fedadagrad.server import FedAdagrad

__all__ = ["FedAdagrad", "FedAdagradConfig"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedAdagrad": "fedtune.algorithms.fedadagrad.server",
        "FedAdagradConfig": "fedtune.algorithms.fedadagrad.config",
    },
)
