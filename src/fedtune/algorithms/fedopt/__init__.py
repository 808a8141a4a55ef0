"""What FedAdagrad, FedAdam and FedYogi share: adaptive server optimisers on the LoRA adapter (Reddi,
Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated Optimization", ICLR 2021).

Algorithm 2 of the paper, with FedIT's clients. Round t: the sampled clients train the global adapter
x_t locally (the ``fit`` task); the server takes the mean of their adapters weighted by example count
(under ``dp`` or ``secagg`` the release of that mean), Delta_t = mean - x_t, and steps

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                   (FedAdagrad, ``fedadagrad``)
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                 (FedAdam, ``fedadam``)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  (FedYogi, ``fedyogi``)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0 and v_{-1} = tau^2 (the algorithm asks v_{-1} >= tau^2), all per entry. As in
Algorithm 2 there is no bias correction (Flower's FedAdam applies Adam's; ours does not), and FedAdagrad
keeps beta1 (Flower's fixes it at 0). The clients run the run's ``train:`` optimiser (AdamW by default)
where the paper's run SGD: the server step is the paper's, the local one is FedIT's.

The optimiser only post-processes the released mean, so client-level DP and secure aggregation apply
as they do to FedIT. The three differ in one line, the v update (``maths.SECOND_MOMENTS``): this package
holds everything they share, and each method's own package (``fedadam``, ``fedyogi``, ``fedadagrad``)
names it, its config section and its rule.

Layout: ``config`` (the shared section base), ``maths`` (the step), ``client`` (the ``fit`` task),
``server`` (the rounds).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedopt.config import FedOptConfig
    from fedtune.algorithms.fedopt.maths import (
        SECOND_MOMENTS,
        adagrad_second_moment,
        adam_second_moment,
        adaptive_step,
        initial_moments,
        yogi_second_moment,
    )
    from fedtune.algorithms.fedopt.server import FedOpt

__all__ = [
    "SECOND_MOMENTS",
    "FedOpt",
    "FedOptConfig",
    "adagrad_second_moment",
    "adam_second_moment",
    "adaptive_step",
    "initial_moments",
    "yogi_second_moment",
]

# The parts load on first use: importing the shared config base does not import torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedOpt": "fedtune.algorithms.fedopt.server",
        "FedOptConfig": "fedtune.algorithms.fedopt.config",
        **dict.fromkeys(
            (
                "SECOND_MOMENTS",
                "adagrad_second_moment",
                "adam_second_moment",
                "adaptive_step",
                "initial_moments",
                "yogi_second_moment",
            ),
            "fedtune.algorithms.fedopt.maths",
        ),
    },
)
