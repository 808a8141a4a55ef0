"""FedPFT's maths as pure functions: FedOT's adapter layers, the seeded samples of examples. (Saliency,
sub-model surgery, eq. 13's loss and the APoZ counts are ``fedtune.models.ffn`` and
``fedtune.train.ffn_distill``; the distillations' inputs are ``distill``.)
"""

from __future__ import annotations

import numpy as np


def adapter_layers(num_layers: int, edge: int) -> tuple[int, ...]:
    """FedOT's adapter: the first and last ``edge`` layers."""
    return tuple(sorted(set(range(edge)) | set(range(num_layers - edge, num_layers))))


def sample_indices(count: int, limit: int | None, seed: int | list[int]) -> list[int] | None:
    """A seeded sample of ``limit`` of ``count`` indices, sorted; None when all ``count`` fit."""
    if limit is None or count <= limit:
        return None
    rng = np.random.default_rng(seed)
    return [int(i) for i in sorted(rng.choice(count, limit, replace=False))]
