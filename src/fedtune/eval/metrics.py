"""Scores for generated text and log-likelihoods: small pure functions over lists of strings.

Per-example metrics return one float per example so callers can average them per category or
per seed; corpus metrics (``dist_n``) return a single float.
"""

from __future__ import annotations

import math
import re
import statistics
import string
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from typing import Any

from rouge_score import rouge_scorer

# The minus sign only counts when it does not follow a word or digit, so the range "3-4" reads
# as 3 and 4 rather than 3 and -4; thousands separators are dropped before conversion.
_NUMBER = re.compile(r"(?P<sign>(?<![\w)])-)?\$?(?P<digits>\d[\d,]*(?:\.\d+)?|\.\d+)")
_GSM8K_ANSWER_MARK = "####"


@cache
def _rouge_l_scorer() -> Any:
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; an empty list is an error rather than a silent 0 or NaN."""
    if not values:
        raise ValueError("mean of an empty list")
    return math.fsum(values) / len(values)


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F-measure per example, Porter-stemmed.

    ``rouge_score``'s tokenizer keeps only ASCII letters and digits, so non-Latin text scores 0.
    """
    scorer = _rouge_l_scorer()
    return [
        scorer.score(reference, prediction)["rougeL"].fmeasure
        for prediction, reference in zip(predictions, references, strict=True)
    ]


def dist_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n: unique n-grams over all n-grams in the corpus, whitespace tokens.

    n-grams do not cross text boundaries; 0 when no text has ``n`` tokens.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    ngrams = [
        tuple(tokens[start : start + n])
        for tokens in (text.split() for text in texts)
        for start in range(len(tokens) - n + 1)
    ]
    return len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def _parse_number(match: re.Match[str]) -> float:
    return float((match["sign"] or "") + match["digits"].replace(",", ""))


def extract_number(text: str) -> float | None:
    """The answer number in GSM8K style: the first number after the last ``####``, else the last number.

    Understands thousands commas, a leading minus or ``$``, and decimals; ``None`` when there is none.
    """
    if _GSM8K_ANSWER_MARK in text:
        marked = _NUMBER.search(text.rsplit(_GSM8K_ANSWER_MARK, 1)[1])
        if marked is not None:
            return _parse_number(marked)
    matches = list(_NUMBER.finditer(text))
    return _parse_number(matches[-1]) if matches else None


def numeric_accuracy(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where the extracted numbers agree within 1e-6, else 0.0 (also when either has no number)."""
    scores = []
    for prediction, reference in zip(predictions, references, strict=True):
        predicted, expected = extract_number(prediction), extract_number(reference)
        matched = predicted is not None and expected is not None and abs(predicted - expected) < 1e-6
        scores.append(float(matched))
    return scores


def normalize_answer(text: str) -> str:
    """Lowercase, collapse whitespace and drop trailing punctuation, so "Paris." equals "paris"."""
    collapsed = " ".join(text.lower().split())
    return collapsed.rstrip(string.punctuation).rstrip()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where the normalised prediction equals the normalised reference, else 0.0."""
    return [
        float(normalize_answer(prediction) == normalize_answer(reference))
        for prediction, reference in zip(predictions, references, strict=True)
    ]


def perplexity_from_nll(total_nll: float, num_tokens: int) -> float:
    """``exp(total_nll / num_tokens)``; infinite rather than an overflow error for a diverged model."""
    if num_tokens <= 0:
        raise ValueError(f"perplexity needs at least one scored token, got {num_tokens}")
    try:
        return math.exp(total_nll / num_tokens)
    except OverflowError:
        return math.inf


def choice_predictions(
    scores: Sequence[Sequence[float]], choices: Sequence[Sequence[str]], *, normalize: bool = False
) -> list[int]:
    """Index of the best choice per question from each choice's summed log-likelihood.

    ``normalize`` divides each log-likelihood by its choice's length in characters first (lm-eval's
    ``acc_norm``; ``acc`` compares the sums). Ties go to the first choice, as ``numpy.argmax``.
    """
    predictions = []
    for row, options in zip(scores, choices, strict=True):
        if len(row) != len(options):
            raise ValueError(f"{len(row)} scores for {len(options)} choices")
        values = (
            [score / len(choice) for score, choice in zip(row, options, strict=True)] if normalize else row
        )
        predictions.append(max(range(len(values)), key=values.__getitem__))
    return predictions


def choice_hits(predictions: Sequence[int], answers: Sequence[int]) -> list[float]:
    """1.0 where the predicted choice is the answer, else 0.0."""
    return [float(predicted == answer) for predicted, answer in zip(predictions, answers, strict=True)]


def commonest_answer(choices: Sequence[Sequence[str]], answers: Sequence[int]) -> tuple[str, float] | None:
    """The answer a model that gives one answer to every question would best give, and the share of
    the questions it gets right: the reference a multiple-choice score must beat before it says the
    model learned the task (on 59 "yes" of 96 yes/no questions, answering "yes" scores 61.5).

    Only where every question offers the same choices (a class-label task): where they differ, no one
    answer fits every question, and None. Ties go to the first choice; no questions: None."""
    if len(choices) != len(answers):
        raise ValueError(f"{len(choices)} questions' choices for {len(answers)} answers")
    options = tuple(choices[0]) if choices else ()
    if not options or any(tuple(offered) != options for offered in choices):
        return None
    counts = [0] * len(options)
    for answer in answers:
        if not 0 <= answer < len(options):
            raise ValueError(f"answer {answer} is not a choice (0..{len(options) - 1})")
        counts[answer] += 1
    best = max(range(len(options)), key=counts.__getitem__)
    return options[best], counts[best] / len(answers)


def by_category(scores: Sequence[float], categories: Sequence[str]) -> dict[str, float]:
    """Mean score per category, keys sorted so reports are stable across runs."""
    grouped: defaultdict[str, list[float]] = defaultdict(list)
    for score, category in zip(scores, categories, strict=True):
        grouped[category].append(score)
    return {category: mean(grouped[category]) for category in sorted(grouped)}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1), as reported over seeds; std is 0.0 for one value."""
    if len(values) == 1:
        return float(values[0]), 0.0
    return mean(values), statistics.stdev(values)
