"""FedKSeed's config section (``fedkseed:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config import AlgorithmConfig


class FedKSeedConfig(AlgorithmConfig):
    """Zeroth-order full-parameter tuning against ``num_seeds`` candidate seeds (Qin et al., 2024)."""

    # The round's model change is the example-weighted mean of the clients' K-vectors of per-seed
    # scalars, through Algorithm.aggregate: a bounded mean once each vector is clipped (dp.clip_norm).
    dp_refused = None
    quantization_refused = (
        "fedkseed tunes every weight of the model in place (w <- w - lr g z): 4- and 8-bit weights cannot "
        "take those small steps; run it unquantised (model.quantization: null)"
    )

    num_seeds: int = Field(4096, ge=1)
    """K, the candidate seeds every perturbation is drawn from (fixed for the run; the paper's 4096)."""
    lr: float = Field(3e-7, gt=0)
    """The zeroth-order step size eta: each local step is w <- w - eta g z (train.lr is not used)."""
    eps: float = Field(5e-4, gt=0)
    """The perturbation scale epsilon of the estimate g = (L(w + eps z) - L(w - eps z)) / (2 eps)."""
    sampling: Literal["uniform", "importance"] = "uniform"
    """How a local step picks its seed: uniformly, or by the paper's seed importance (softmax of each
    seed's normalised mean |scalar| over the history)."""
    restore: Literal["copy", "undo"] = "copy"
    """How a client process puts the global model back after its local steps: ``copy`` from a host copy
    taken before them (bit-exact: resume and every backend give the same numbers; one model's size of
    host memory), or ``undo`` by taking the steps back in reverse (no copy; exact up to rounding)."""
    importance_alpha: float = Field(1.0, gt=0)
    """With ``sampling: importance``: the softmax scale on the importance normalised to [0, 1]."""
