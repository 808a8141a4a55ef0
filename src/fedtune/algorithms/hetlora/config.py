"""HetLoRA's config section (``hetlora:``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from fedtune.algorithms.hetrank.config import check_ranks
from fedtune.config import AlgorithmConfig


class HetLoRAConfig(AlgorithmConfig):
    """Per-client ranks, rank self-pruning and sparsity-weighted aggregation of zero-padded adapters."""

    dp_refused = (
        "its sparsity-weighted aggregation weighs each client by the norm of its own update, so the "
        "weights depend on the updates themselves: the result is not a fixed-weight mean whose "
        "sensitivity clipping bounds, and a secure sum cannot compute it"
    )

    ranks: list[int] | None = None
    """Per-client LoRA ranks, assigned round-robin in client order (default: `lora.r` for all)."""
    reg_weight: float = Field(0.01, ge=0)
    """lambda: weight of the self-pruning regulariser sum_m ||B_m,tail A_m,tail||_F in the local loss."""
    gamma: float = Field(0.75, gt=0, lt=1)
    """The kept fraction: rank r has the tail floor(gamma r)..r-1; pruning keeps floor(gamma r) ranks."""
    prune: bool = True
    """Rank self-pruning: a client whose tail norm fell below its previous round's drops its tail."""
    min_rank: int = Field(1, ge=1)
    """No client is pruned below this rank."""

    @model_validator(mode="after")
    def _check_ranks(self) -> HetLoRAConfig:
        check_ranks("hetlora", self.ranks)
        return self
