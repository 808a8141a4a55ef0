"""The per-client rank assignment both heterogeneous-rank sections share (``hetlora.ranks``,
``flexlora.ranks``): its check here, beside the rule that assigns it (``maths.assign_ranks``)."""

from __future__ import annotations

from collections.abc import Sequence


def check_ranks(section: str, ranks: Sequence[int] | None) -> None:
    """A rank list is non-empty and positive (its bound, ``lora.r``, is checked with the whole config)."""
    if ranks is not None and (not ranks or min(ranks) < 1):
        raise ValueError(f"{section}.ranks must be a non-empty list of positive ranks, got {list(ranks)}")


def ranks_problem(section: str, ranks: Sequence[int] | None, lora_rank: int) -> str | None:
    """Why ``ranks`` cannot run with ``lora.r`` (the global adapter's rank, which bounds every client's)."""
    if ranks is not None and max(ranks) > lora_rank:
        return (
            f"{section}.ranks {list(ranks)}: a client's rank {max(ranks)} exceeds lora.r = {lora_rank}, the "
            f"rank of the global adapter; set lora.r to the largest client rank"
        )
    return None
