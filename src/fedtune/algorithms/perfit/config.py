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

    sparsity: float = Field(0.5, gt=0, lt=1)
    expanded_rank: int | None = Field(None, ge=1)
    budgets: list[int] | None = None
    search_steps: int = Field(5, ge=1)
    importance: Importance = "first"
    search_batches: int | None = Field(None, ge=1)
    # Ablation (not in the paper): false skips Alg. 3, each client keeps the values it trained.
    aggregate: bool = True

    @model_validator(mode="after")
    def _check_budgets(self) -> PerFITConfig:
        if self.budgets is not None and (not self.budgets or min(self.budgets) < 1):
            raise ValueError("perfit.budgets must be a non-empty list of positive ranks")
        return self
