"""The ``fed:`` section: rounds, client sampling, how replies are screened and combined, the wire."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedtune.config.base import Section


class FedConfig(Section):
    mode: Literal["federated", "standalone", "centralized"] = "federated"
    """`federated`, or a baseline: `standalone` (each client trains on its own data only; the evaluation
    averages the client models) or `centralized` (one model on the union of the client data)."""
    rounds: int = Field(3, ge=1)
    """Federated rounds."""
    clients_per_round: int | None = Field(None, ge=1)
    """Clients sampled per round (default: `fraction` of them)."""
    fraction: float = Field(1.0, gt=0, le=1)
    """Share of the clients sampled per round when `clients_per_round` is unset."""
    min_replies: int = Field(1, ge=1)
    """A round counts when at least this many sampled clients replied."""
    client_timeout: float | None = Field(None, gt=0)
    """Seconds to wait for a client's reply."""
    norm_bound: float | None = Field(None, gt=0)
    """Reject a reply whose update norm exceeds this."""
    screen: float | None = Field(10.0, gt=1)
    """An adaptive bound on by default: a reply whose update norm (against what the server sent) exceeds
    ``screen`` x the median of the call's update norms is rejected; it needs 3 or more such replies
    (with 2 the median cannot tell the liar). null turns it off."""
    aggregator: Literal["mean", "median", "trimmed_mean"] = "mean"
    """How the server combines client tensors: "mean" (weighted by example count, the methods' own rule),
    or, robust to a few lying clients, the coordinate-wise "median" or "trimmed_mean" (unweighted;
    ``trim`` is the share of values dropped at each end of every coordinate)."""
    trim: float = Field(0.2, ge=0, lt=0.5)
    """`trimmed_mean`: the share of values dropped at each end of every coordinate."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many round checkpoints to keep."""
    backend: Literal["simulation", "flower", "ray"] = "simulation"
    """`simulation` (in-process), `flower` (a Flower deployment) or `ray` (Ray actors; `docs/scaling.md`)."""
    wire_dtype: Literal["fp32", "fp16"] = "fp32"
    """fp16: float32 arrays of >= 1024 entries travel as fp16 in both directions (half the bytes; the
    receiver computes with the rounded values). Bytes are counted as sent."""
    budget_mb: float | None = Field(None, gt=0, allow_inf_nan=False)
    """A communication budget in MB (10^6 bytes), up plus down as metrics.jsonl counts them; null: none.
    The run stops cleanly (final artifacts written) before the round predicted to pass it: the next
    round is taken to cost the largest round after the first (the first while it is the only one).
    When round 1 alone passes it, the run stops after round 1. `fedtune resume` on a run it stopped
    runs no more rounds and says why again. FlowerTune's leaderboard caps runs at 200000."""

    @model_validator(mode="after")
    def _trim_used(self) -> FedConfig:
        if self.trim != type(self).model_fields["trim"].default and self.aggregator != "trimmed_mean":
            raise ValueError(
                f"fed.trim {self.trim:g} is set but fed.aggregator is {self.aggregator!r}: only trimmed_mean "
                "trims, so it would be ignored. Set fed.aggregator: trimmed_mean, or remove fed.trim"
            )
        return self
