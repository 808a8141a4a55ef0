"""FlexLoRA's config section (``flexlora:``)."""

from __future__ import annotations

from pydantic import model_validator

from fedtune.algorithms.hetrank.config import check_ranks
from fedtune.config import AlgorithmConfig


class FlexLoRAConfig(AlgorithmConfig):
    """Per-client ranks; the server aggregates full-size products and redistributes them by SVD."""

    dp_refused = (
        "its round's change is the data-weighted mean of the products B_i A_i, which are not linear in "
        "the replies: clipping or securely summing the factors A_i and B_i bounds neither a client's "
        "product nor the sum of products (sum B_i A_i is not (sum B_i)(sum A_i)); a sound release would "
        "clip and sum each client's dense product update, which this method does not send"
    )

    ranks: list[int] | None = None
    """Per-client LoRA ranks, assigned round-robin in client order (default: `lora.r` for all)."""

    @model_validator(mode="after")
    def _check_ranks(self) -> FlexLoRAConfig:
        check_ranks("flexlora", self.ranks)
        return self
