"""Claims and their verdicts: orderings compare means rounded to 12 decimals, so that means of the same
fractions summed in another order compare equal: "holds", "does not hold", or "tie" where every mean is
the same (a tie is never "holds"); and in how many of the seeds every row has they hold. `paired_interval`
judges a claim by its noise instead: the paired difference over seeds with a Student-t 95% interval, and
the verdict "holds" (above 0), "reversed" (below) or "tie" (contains 0)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from experiments.tables.aggregate import mean_std


def _rounded(values: Iterable[float]) -> list[float]:
    # equal means of fractions must compare equal whatever order float summed them in
    return [round(float(value), 12) for value in values]


def rises(values: Sequence[float], strict: bool = True) -> bool:
    """Whether ``values`` rise from first to last (``<``, or ``<=`` with ``strict=False``), rounded."""
    pairs = itertools.pairwise(_rounded(values))
    return all(a < b for a, b in pairs) if strict else all(a <= b for a, b in pairs)


def verdict(means: Sequence[float], strict: bool = True) -> str:
    """Whether the paper's ordering, ``means`` rising, holds: "tie" when every rounded mean is the same
    (for ``<`` and ``<=`` alike: nothing separates the rows), else "holds" or "does not hold"."""
    if len(set(_rounded(means))) == 1:
        return "tie"
    return "holds" if rises(means, strict) else "does not hold"


def common_seeds(columns: Sequence[Mapping[str, float]]) -> list[str]:
    """The seeds every column (seed -> value) has, in numeric order."""
    if not columns:
        return []
    return sorted(set(columns[0]).intersection(*columns[1:]), key=int)


def seeds_holding(columns: Sequence[Mapping[str, float]], strict: bool = True) -> tuple[int, int]:
    """Of the seeds every column has: in how many the values rise from the first column to the last,
    and how many there are."""
    seeds = common_seeds(columns)
    return sum(rises([column[seed] for column in columns], strict) for seed in seeds), len(seeds)


@dataclass(frozen=True)
class Verdict:
    """A claim that values rise from the first column to the last, checked: ``verdict`` on the means
    ("holds", "does not hold" or "tie"), and in how many of the ``seeds`` every column has it holds."""

    means: tuple[float, ...]
    verdict: str
    holding: int
    seeds: int


def on_common_seeds(columns: Sequence[Mapping[str, float]]) -> tuple[list[dict[str, float]], str]:
    """``columns`` (seed -> value each) cut to the seeds they all have, and a note naming those seeds when
    a column had others (the rows' runs were made at different times): rows are compared seed by seed."""
    both = common_seeds(columns)
    cut = [{seed: values[seed] for seed in both} for values in columns]
    if not both or all(len(values) == len(both) for values in columns):
        return cut, ""
    which = f"seed {both[0]}" if len(both) == 1 else f"seeds {', '.join(both)}"
    return cut, f" (on {which}, which every row compared has)"


def check(
    columns: Sequence[Mapping[str, float]], means: Sequence[float] | None = None, strict: bool = True
) -> Verdict:
    """Whether ``columns`` (seed -> value each, from the row claimed lowest to the highest) rise: on
    ``means`` (default: each column's mean over its seeds) and seed by seed (`seeds_holding`)."""
    shown = tuple(means) if means is not None else tuple(mean_std(c.values())[0] for c in columns)
    holding, seeds = seeds_holding(columns, strict)
    return Verdict(shown, verdict(shown, strict), holding, seeds)


@dataclass(frozen=True)
class Interval:
    """A claim "``better`` beats ``worse``" judged by the paired difference over the seeds both have (same
    seed: same partition, sampling and test subset): per seed the gain ``sign * (better - worse)``
    (``sign`` -1 where lower is better), its ``mean``, sample standard deviation ``sd`` (ddof 1) and the
    Student-t ``level`` interval ``[low, high]`` on ``seeds - 1`` degrees of freedom."""

    mean: float
    sd: float
    low: float
    high: float
    seeds: int
    level: float

    @property
    def verdict(self) -> str:
        """ "holds" (the interval lies above 0), "reversed" (below 0), "tie" (it contains 0), or "one seed"
        (no interval from a single difference)."""
        if self.seeds < 2:
            return "one seed"
        if self.low > 0:
            return "holds"
        if self.high < 0:
            return "reversed"
        return "tie"

    @property
    def no_spread(self) -> bool:
        """Every seed's gain is the same (to float rounding; a choice task's score moves by whole
        questions, so seeds can differ by exactly one question each): the t interval is then the point
        ``mean``, a width of 0 from no evidence of the noise, not a certain interval."""
        return self.seeds >= 2 and self.sd <= 1e-9 * max(1.0, abs(self.mean))

    def text(self, digits: int = 2) -> str:
        """``holds (gain 1.23, 95% CI [0.40, 2.06], 3 seeds)``; with `no_spread`, ``holds (gain 1.04 in
        each of 3 seeds: no spread, the t interval is that point)``."""
        gain = f"gain {self.mean:.{digits}f}"
        if self.seeds < 2:
            return f"{self.verdict} ({gain})"
        if self.no_spread:
            point = "no spread, the t interval is that point"
            return f"{self.verdict} ({gain} in each of {self.seeds} seeds: {point})"
        ci = f"{round(100 * self.level)}% CI [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        return f"{self.verdict} ({gain}, {ci}, {self.seeds} seeds)"


def paired_interval(
    worse: Mapping[str, float],
    better: Mapping[str, float],
    *,
    lower_is_better: bool = False,
    level: float = 0.95,
) -> Interval:
    """The `Interval` of the claim that ``better`` (seed -> value) beats ``worse``, on their common seeds:
    a t interval of the paired gains (``scipy.stats.t``); NaN bounds for fewer than two seeds."""
    from scipy import stats

    seeds = common_seeds([worse, better])
    sign = -1.0 if lower_is_better else 1.0
    gains = np.array([sign * (better[seed] - worse[seed]) for seed in seeds], dtype=np.float64)
    if len(gains) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), float("nan"), 0, level)
    mean = float(gains.mean())
    if len(gains) < 2:
        return Interval(mean, float("nan"), float("nan"), float("nan"), 1, level)
    sd = float(gains.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, len(gains) - 1)) * sd / np.sqrt(len(gains))
    return Interval(mean, sd, mean - half, mean + half, len(gains), level)


def claim_text(
    columns: Sequence[Mapping[str, float]],
    names: Sequence[str] = (),
    *,
    lower_is_better: bool = False,
    digits: int = 2,
    scale: float = 1.0,
) -> str:
    """A claim's verdict by its noise, for the line that states it on means: ``columns`` (seed -> value
    each) run from the row claimed worst to the best, and each adjacent pair gets its `paired_interval`
    (values times ``scale``). Two columns: ``by interval: holds (gain 0.12, 95% CI [0.01, 0.23], 3 seeds)``;
    with ``names`` (needed for more columns: a < b < c) each pair is named: ``by interval: b over a holds
    (...); c over b tie (...)``."""
    return "by interval: " + "; ".join(
        interval_texts(columns, names, lower_is_better=lower_is_better, digits=digits, scale=scale)
    )


def interval_texts(
    columns: Sequence[Mapping[str, float]],
    names: Sequence[str] = (),
    *,
    lower_is_better: bool = False,
    digits: int = 2,
    scale: float = 1.0,
) -> list[str]:
    """The parts of `claim_text`, one per adjacent pair of ``columns``: ``holds (...)`` or, with ``names``,
    ``b over a holds (...)``."""
    if len(names) not in (0, len(columns)):
        raise ValueError(f"claim_text: {len(names)} names for {len(columns)} columns")
    if len(columns) > 2 and not names:
        raise ValueError(f"claim_text: a claim of {len(columns)} rows needs their names")
    scaled = [{seed: scale * value for seed, value in column.items()} for column in columns]
    parts = []
    for index, (worse, better) in enumerate(itertools.pairwise(scaled)):
        text = paired_interval(worse, better, lower_is_better=lower_is_better).text(digits)
        parts.append(f"{names[index + 1]} over {names[index]} {text}" if names else text)
    return parts
