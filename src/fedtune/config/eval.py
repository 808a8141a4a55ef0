"""The ``eval:`` section: what is scored, how often, and how answers are generated."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config.base import Section

EvalMetric = Literal[
    "rougeL",
    "perplexity",
    "dist3",
    "dist4",
    "exact_match",
    "numeric_accuracy",
    "pass_at_1",
    "acc",
    "acc_norm",
]
# lm-eval's multiple-choice accuracies: they score only records with choices.
CHOICE_METRICS = ("acc", "acc_norm")


def _default_metrics() -> list[EvalMetric]:
    return ["rougeL", "perplexity"]


class EvalConfig(Section):
    metrics: list[EvalMetric] = Field(default_factory=_default_metrics)
    """What is scored; `acc` and `acc_norm` score multiple-choice records by the log-likelihood of each
    choice (`acc_norm`: divided by the choice's length in characters)."""
    every: int = Field(1, ge=1)
    """Evaluate every this many rounds (and after the last)."""
    before: bool = True
    """Evaluate before training too (round 0)."""
    max_examples: int | None = Field(32, ge=1)
    """Test examples scored (a seeded subset; `null`: all)."""
    max_new_tokens: int = Field(48, ge=1)
    """Tokens generated per answer."""
    batch_size: int = Field(8, ge=1)
    """Examples per evaluation batch."""
    temperature: float = Field(0.0, ge=0)
    """0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    seeds: int = Field(1, ge=1)
    """Sampling seeds per evaluation; with sampling, metrics are the mean over seeds and `<metric>_std`
    their spread."""
    extra_datasets: list[str] = Field(default_factory=list)
    """More test sets; their metrics are prefixed `<name>/`."""
    personal: bool = False
    """Client-side (personal) evaluation: every client evaluates its own model on its own held-out
    split (data.holdout) at every eval round; metrics personal/<name> (mean over clients),
    personal/<name>_weighted (by held-out size) and each client's own in eval_by_client."""
