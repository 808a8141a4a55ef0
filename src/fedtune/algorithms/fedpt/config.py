"""FedPT's config section ``fedpt:``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config import AlgorithmConfig


class FedPTConfig(AlgorithmConfig):
    """FedPT: clients tune the small LM (``model``); the server proxy-tunes ``large_model`` with it.

    ``distill: false`` is the FedAvg+PT baseline (no distillation step). ``alpha`` steers the
    distillation teacher and decoding; at evaluation ``alpha_grid`` is searched on the validation
    split (``alpha_search``) and the best value is used on the test sets.
    """

    large_model: str = "smollm2-135m-instruct"
    large_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    distill: bool = True
    alpha: float = Field(1.0, ge=0)
    alpha_grid: list[float] = Field(default_factory=lambda: [1.0, 1.3, 1.5, 1.8, 2.0])
    alpha_search: Literal["final", "every", "never"] = "final"
    alpha_search_seeds: int = Field(1, ge=1)
    alpha_search_examples: int | None = Field(None, ge=1)
    kd_lambda: float = Field(0.1, ge=0, le=1)
    kd_examples: int = Field(128, ge=1)
    kd_batch_size: int = Field(16, ge=1)
    kd_steps: int = Field(8, ge=1)
    kd_optimizer: Literal["adamw", "sgd", "prodigy"] = "prodigy"
    kd_lr: float = Field(1.0, gt=0)
    kd_weight_decay: float = Field(0.01, ge=0)
    kd_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    # The distillation's own optimiser settings (the defaults are train's defaults, as before).
    kd_betas: tuple[float, float] = (0.9, 0.999)
    kd_momentum: float = Field(0.0, ge=0)
    kd_warmup_ratio: float = Field(0.0, ge=0, lt=1)
    kd_min_lr_ratio: float = Field(0.0, ge=0, le=1)
    kd_clip_norm: float | None = Field(1.0, gt=0)
    teacher_cache: Literal["disk", "memory", "recompute"] = "disk"
    teacher_dtype: Literal["fp16", "fp32"] = "fp16"
    eval_small: bool = True
