"""A communication budget (``fed.budget_mb``): stop a run before the round that would pass it.

FlowerTune's LLM leaderboard caps a run's communication at 200,000 MB; a run with a budget stops
cleanly (final artifacts written) before the round whose predicted traffic would take it over. Traffic
is what metrics.jsonl counts per round, up plus down, in MB of 10^6 bytes (``fedtune.units``).

The next round is predicted to cost the largest round after the first, or the first round while it is
the only one: a method's first round often carries a one-off download (FedBiOT's emulator, FedPFT's
sub-model) that later rounds do not repeat, and the largest later round is the conservative guess when
client sampling makes rounds differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedtune.units import BYTES_PER_MB


def round_mb(row: Mapping[str, Any]) -> float:
    """A metrics row's traffic, up plus down, in MB (a row without counts, like round 0's, is 0)."""
    return ((row.get("bytes_up") or 0) + (row.get("bytes_down") or 0)) / BYTES_PER_MB


def trained_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [row for row in rows if row.get("round", 0) > 0]


def used_mb(rows: Sequence[Mapping[str, Any]]) -> float:
    """The traffic of every trained round in ``rows``, in MB."""
    return sum(round_mb(row) for row in trained_rows(rows))


def next_round_mb(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The predicted traffic of the round after ``rows`` in MB; None before any round has run."""
    trained = [round_mb(row) for row in trained_rows(rows)]
    if not trained:
        return None
    return max(trained[1:]) if len(trained) > 1 else trained[0]


@dataclass(frozen=True)
class BudgetStop:
    """Why the run stops before ``next_round``: ``used`` MB spent, ``predicted`` MB for the next round."""

    budget: float
    used: float
    predicted: float
    next_round: int

    def message(self) -> str:
        rounds = "round 1" if self.next_round == 2 else f"rounds 1-{self.next_round - 1}"
        alone = "; that alone passes the budget" if self.used > self.budget else ""
        return (
            f"communication budget reached: fed.budget_mb is {self.budget:g} MB, {self.used:.4g} MB used in "
            f"{rounds}{alone}, and round {self.next_round} would need about {self.predicted:.4g} MB more: "
            f"stopping before round {self.next_round}"
        )


def budget_stop(rows: Sequence[Mapping[str, Any]], budget: float | None) -> BudgetStop | None:
    """A stop when the rounds in ``rows`` plus the predicted next round pass ``budget`` MB, else None.

    Before any round nothing is known, so the first round always runs; when it alone passes the
    budget the run stops after it.
    """
    predicted = next_round_mb(rows)
    if budget is None or predicted is None:
        return None
    used = used_mb(rows)
    if used + predicted <= budget:
        return None
    last = max(int(row["round"]) for row in trained_rows(rows))
    return BudgetStop(budget=budget, used=used, predicted=predicted, next_round=last + 1)
