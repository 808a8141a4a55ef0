"""PerFIT's config section ``perfit:``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedtune.config import AlgorithmConfig

Importance = Literal["first", "second", "mixed"]


class PerFITConfig(AlgorithmConfig):
    """PerFIT's search and budgets; LoRA rank ``lora.r`` is the budget r, ``lora.target_modules`` the
    adapted projections."""

    personal_eval = True
    requires_personal_eval = True
    dp_refused = (
        "each client uploads a mask chosen on its own data, and the server averages every entry over "
        "the clients whose masks hold it: an entry held by one sampled client moves by that client's "
        "whole value, and the masks and per-entry denominators are private yet travel in the clear, so "
        "neither a clipped, noised sum nor a secure sum of whole updates covers it"
    )

    sparsity: float = Field(0.5, gt=0, lt=1)
    """s: the search starts from rank r / (1 - s)."""
    expanded_rank: int | None = Field(None, ge=1)
    """The expanded rank r_e (overrides the one `sparsity` gives)."""
    budgets: list[int] | None = None
    """Per-client ranks, round-robin over the clients (default: `lora.r` for all)."""
    search_steps: int = Field(5, ge=1)
    """T_p: importance steps of the search."""
    importance: Importance = "first"
    """Importance score: first order, second order (Fisher) or mixed."""
    search_batches: int | None = Field(None, ge=1)
    """Batches each search step reads (default: all local batches)."""
    # Where a sampled client starts its round. "global" (the paper, sec. 4.1 step 4): the server keeps a
    # dense expanded module G, sends each sampled client G at its mask and updates G on the entries the
    # round's clients hold. "own" (an ablation): the client resumes from its own values of the last
    # round it trained in, and receives Alg. 3's mean at its entries after each round.
    start: Literal["global", "own"] = "global"
    # LoRA alpha of the expanded module: "rank" = r_e (scaling 1: sec. 5.1 keeps alpha equal to the
    # rank, as FIT's alpha = r), "lora" = lora.alpha (scaling lora.alpha / r_e), or a number.
    alpha: int | Literal["rank", "lora"] = "rank"
    # Ablation (not in the paper, with start: own): false skips Alg. 3, each client keeps what it trained.
    aggregate: bool = True

    @model_validator(mode="after")
    def _check_budgets(self) -> PerFITConfig:
        if self.budgets is not None and (not self.budgets or min(self.budgets) < 1):
            raise ValueError("perfit.budgets must be a non-empty list of positive ranks")
        if not self.aggregate and self.start == "global":
            raise ValueError(
                "perfit.aggregate false (each client keeps what it trained) needs perfit.start: own"
            )
        if isinstance(self.alpha, int) and self.alpha < 1:
            raise ValueError("perfit.alpha must be a positive number, 'rank' or 'lora'")
        return self
