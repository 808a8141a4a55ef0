"""The ``train:`` section: each client's local training (optimizer, schedule, steps)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config.base import Section


class TrainConfig(Section):
    optimizer: Literal["adamw", "sgd", "prodigy"] = "adamw"
    """The clients' local optimizer."""
    lr: float = Field(3e-4, gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """Weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    momentum: float = Field(0.0, ge=0)
    """SGD momentum."""
    batch_size: int = Field(8, ge=1)
    """Examples per step."""
    grad_accum: int = Field(1, ge=1)
    """Batches accumulated per optimizer step."""
    local_epochs: float = Field(1.0, gt=0)
    """Local passes over a client's data per round (unless `max_steps` is set)."""
    max_steps: int | None = Field(None, ge=1)
    """Local steps per round; overrides `local_epochs`."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule."""
    schedule_scope: Literal["round", "global"] = "round"
    """`round`: the schedule restarts every round; `global`: it spans the run."""
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    """Share of the schedule spent warming up."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """The schedule's final learning rate as a share of `lr`."""
    clip_norm: float | None = Field(1.0, gt=0)
    """Gradient norm clipping (`null`: none)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (non-reentrant torch checkpointing), in every local training step: less activation memory,
    about one more forward pass of time."""
