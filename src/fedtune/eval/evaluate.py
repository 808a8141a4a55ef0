"""Evaluate a causal LM on records: generation metrics, multiple-choice accuracy (``acc``,
``acc_norm``) and perplexity, per category too."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from fedtune.data.records import Record
from fedtune.data.templates import TemplateName, build_prompt
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.decode.generate import generate_texts
from fedtune.eval.metrics import by_category, mean
from fedtune.eval.scoring import (
    CHOICE_METRICS,
    NUM_SAMPLES,
    multiple_choice_scores,
    perplexity,
    score_generations,
)


class EvalSettings(Protocol):
    """What an evaluation reads: plain values (a run config's ``eval:`` section is one)."""

    @property
    def metrics(self) -> Sequence[str]: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def seeds(self) -> int: ...


GENERATION_METRICS = ("rougeL", "dist3", "dist4", "exact_match", "numeric_accuracy", "pass_at_1")


@dataclass(frozen=True)
class EvalSet:
    """A test set the runner evaluates on, passed to ``Algorithm.evaluate``.

    ``name`` is ``""`` for the primary set (``data.eval_dataset``, else the dataset's test split) and an
    ``eval.extra_datasets`` name otherwise: a client re-derives the same records from that name.
    """

    name: str
    records: list[Record]


@dataclass
class EvalResult:
    metrics: dict[str, float]
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, str]] = field(default_factory=list)
    by_client: dict[str, dict[str, float]] = field(default_factory=dict)
    """Client-side evaluation: each client's own metrics (``eval_by_client`` in metrics.jsonl)."""


GenerateFn = Callable[[Sequence[str], int], list[str]]
"""``(prompts, seed) -> continuations``: any decoder (a plain LM, a proxy-tuned LM, ...)."""


def evaluate_generations(
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[Record],
    settings: EvalSettings,
    *,
    template: TemplateName,
    seed: int,
) -> EvalResult:
    """Generation metrics of ``generate`` on ``records``: the mean over ``settings.seeds`` sampling seeds.

    With more than one seed and sampling on (``temperature > 0``) each metric also gets a
    ``<metric>_std`` entry (population std over seeds); greedy decoding runs once.
    """
    wanted: list[str] = [m for m in settings.metrics if m in GENERATION_METRICS]
    if not wanted:
        return EvalResult({})
    records = list(records)
    prompts = [build_prompt(rec, template, tokenizer) for rec in records]
    references = [rec.output for rec in records]
    categories = [rec.category for rec in records]
    record_ids = [rec.id for rec in records]
    num_seeds = settings.seeds if settings.temperature > 0 else 1
    runs: list[dict[str, Any]] = []
    for index in range(num_seeds):
        predictions = generate(prompts, seed + index)
        runs.append(
            score_generations(prompts, predictions, references, categories, wanted, record_ids=record_ids)
        )
    metrics: dict[str, float] = {m: float(np.mean([run[m] for run in runs])) for m in wanted}
    if num_seeds > 1:
        metrics.update({f"{m}_std": float(np.std([run[m] for run in runs])) for m in wanted})
    by_category = {
        metric: {cat: float(np.mean([run["by_category"][metric][cat] for run in runs])) for cat in cats}
        for metric, cats in runs[0]["by_category"].items()
    }
    samples = [{"prompt": p, "prediction": pred, "reference": ref} for p, pred, ref in runs[0]["samples"]]
    return EvalResult(metrics, by_category, samples)


def check_choice_records(records: Sequence[Record], metric: str) -> None:
    """Raise naming the first record without choices: ``metric`` cannot score it."""
    for position, rec in enumerate(records):
        if not rec.is_multiple_choice:
            raise ValueError(
                f"metric {metric!r}: record {rec.id!r} (example {position}, category {rec.category!r}) has "
                f"no choices; {' and '.join(CHOICE_METRICS)} score only multiple-choice records (a built-in "
                "multiple_choice dataset such as wordnet-wic, or rows with 'choices' and 'label'); "
                "drop the metric from eval.metrics or evaluate on such a dataset"
            )


def evaluate_choices(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[Record],
    settings: EvalSettings,
    *,
    template: TemplateName,
    max_length: int | None = None,
) -> EvalResult:
    """The ``acc`` / ``acc_norm`` of ``settings.metrics`` on multiple-choice ``records``, per category too.

    Each choice is scored by its log-likelihood after the record's prompt under ``template`` (the
    prompt training puts before ``output``, which is the right choice), in batches of
    ``settings.batch_size``. Samples show the prompt, the ``acc`` choice and the right one.
    """
    wanted = [metric for metric in settings.metrics if metric in CHOICE_METRICS]
    if not wanted:
        return EvalResult({})
    records = list(records)
    check_choice_records(records, wanted[0])
    prompts = [build_prompt(rec, template, tokenizer) for rec in records]
    scores = multiple_choice_scores(
        model,
        tokenizer,
        prompts,
        [rec.choices for rec in records],
        [rec.label for rec in records],
        batch_size=settings.batch_size,
        max_length=max_length,
    )
    categories = [rec.category for rec in records]
    metrics = {metric: mean(scores.hits[metric]) for metric in wanted}
    per_category = {metric: by_category(scores.hits[metric], categories) for metric in wanted}
    samples = [
        {"prompt": prompt, "prediction": rec.choices[choice], "reference": rec.output}
        for prompt, rec, choice in zip(prompts[:NUM_SAMPLES], records, scores.predicted, strict=False)
    ]
    return EvalResult(metrics, per_category, samples)


def perplexity_batches(
    records: Sequence[Record],
    tokenizer: PreTrainedTokenizerBase,
    settings: EvalSettings,
    *,
    template: TemplateName,
    max_length: int,
) -> list[dict[str, torch.Tensor]]:
    examples = encode_records(records, tokenizer, template, max_length)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    return make_batches(examples, settings.batch_size, pad, seed=0, bucketing=True, shuffle=False)


def evaluate_lm(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[Record],
    settings: EvalSettings,
    *,
    template: TemplateName,
    max_length: int,
    seed: int,
) -> EvalResult:
    """``model`` on ``records``: the generation metrics, ``acc`` / ``acc_norm`` and ``perplexity`` of
    ``settings.metrics``; ``max_length`` bounds the scored sequences as in training."""

    def generate(prompts: Sequence[str], sample_seed: int) -> list[str]:
        return generate_texts(
            model,
            tokenizer,
            prompts,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=sample_seed,
        )

    result = merge_results(
        evaluate_generations(generate, tokenizer, records, settings, template=template, seed=seed),
        evaluate_choices(model, tokenizer, records, settings, template=template, max_length=max_length),
    )
    if "perplexity" in settings.metrics:
        batches = perplexity_batches(records, tokenizer, settings, template=template, max_length=max_length)
        result.metrics["perplexity"] = float(perplexity(model, batches))
    return result


def prefixed(result: EvalResult, prefix: str) -> EvalResult:
    """The same result with every metric name (and per-category metric name) prefixed."""
    return EvalResult(
        {prefix + k: v for k, v in result.metrics.items()},
        {prefix + k: v for k, v in result.by_category.items()},
        result.samples,
    )


def merge_results(*results: EvalResult) -> EvalResult:
    merged = EvalResult({})
    for result in results:
        merged.metrics.update(result.metrics)
        merged.by_category.update(result.by_category)
        merged.samples = merged.samples or result.samples
        merged.by_client.update(result.by_client)
    return merged


METRIC = "metric/"
CATEGORY = "category/"


def result_payload(result: EvalResult) -> dict[str, Any]:
    """An evaluation result as flat scalars, ready for a client's reply payload: ``metric/<name>`` and
    ``category/<metric>/<category>``."""
    reply: dict[str, Any] = {METRIC + name: float(value) for name, value in result.metrics.items()}
    for metric, categories in result.by_category.items():
        reply.update({f"{CATEGORY}{metric}/{cat}": float(value) for cat, value in categories.items()})
    return reply


MAX_PERPLEXITY = 1e6
"""The largest perplexity a client may report (about 13.8 nats a token): above the uniform guess over any
vocabulary in use (152k tokens: 11.9 nats) by two nats. The vocabulary size itself is no bound: an honest
client whose training diverged can score worse than the uniform guess."""


RATES = ("rougeL", "dist3", "dist4", "exact_match", "numeric_accuracy", "pass_at_1", "acc", "acc_norm")
"""The metrics that are shares of something, in [0, 1]."""


def metric_range(name: str) -> tuple[float, float]:
    """What a metric named ``name`` (``perplexity``, ``rougeL``, ``acc`` ..., possibly prefixed as
    ``adapfu/perplexity``) can be: perplexities in [1, MAX_PERPLEXITY], every rate (Rouge-L, accuracies,
    exact match, pass@1, distinct-n) in [0, 1]; anything else only finite."""
    base = name.rpartition("/")[2]
    if base.startswith("perplexity"):
        return 1.0, MAX_PERPLEXITY
    if base in RATES:
        return 0.0, 1.0
    return -math.inf, math.inf


def implausible_metric(reply: Mapping[str, Any]) -> str | None:
    """Why a client's evaluation reply (``result_payload``'s keys) reports a value its metric cannot
    take, or None."""
    for key, value in reply.items():
        if key.startswith(METRIC):
            name = key[len(METRIC) :]
        elif key.startswith(CATEGORY):
            name = key[len(CATEGORY) :].partition("/")[0]
        else:
            continue
        low, high = metric_range(name)
        if not low <= float(value) <= high:
            return f"'{key}' = {float(value):.6g} is outside what it can be ([{low:g}, {high:g}])"
    return None


def payload_result(reply: Mapping[str, Any]) -> EvalResult:
    """The inverse of ``result_payload``."""
    metrics = {k[len(METRIC) :]: float(v) for k, v in reply.items() if k.startswith(METRIC)}
    by_category: dict[str, dict[str, float]] = {}
    for key, value in reply.items():
        if key.startswith(CATEGORY):
            metric, _, cat = key[len(CATEGORY) :].partition("/")
            by_category.setdefault(metric, {})[cat] = float(value)
    return EvalResult(metrics, by_category)


def client_results(
    results: Mapping[str, EvalResult], weights: Mapping[str, int], prefix: str = "personal/"
) -> EvalResult:
    """Per-client results aggregated: ``<prefix><m>`` is the mean over clients, ``<prefix><m>_weighted``
    the mean weighted by ``weights`` (e.g. held-out sizes); ``by_client`` keeps each client's own.

    Only metrics every client reported are aggregated (a client may lack e.g. a generation metric).
    """
    if not results:
        return EvalResult({})
    clients = sorted(results)
    shared = set.intersection(*(set(results[c].metrics) for c in clients))
    total = sum(weights[c] for c in clients)
    metrics: dict[str, float] = {}
    for name in sorted(shared):
        values = [results[c].metrics[name] for c in clients]
        metrics[prefix + name] = float(np.mean(values))
        if total > 0:
            metrics[f"{prefix}{name}_weighted"] = float(
                sum(weights[c] * v for c, v in zip(clients, values, strict=True)) / total
            )
    by_client = {c: dict(results[c].metrics) for c in clients}
    return EvalResult(metrics, by_client=by_client)


def mean_results(results: Sequence[EvalResult]) -> EvalResult:
    """Average metrics over several models (e.g. one per client in standalone mode)."""
    if not results:
        raise ValueError("mean_results needs at least one result")
    keys = results[0].metrics.keys()
    metrics = {k: sum(r.metrics[k] for r in results) / len(results) for k in keys}
    by_category: dict[str, dict[str, float]] = {}
    for metric, cats in results[0].by_category.items():
        by_category[metric] = {
            cat: sum(r.by_category[metric][cat] for r in results) / len(results) for cat in cats
        }
    return EvalResult(metrics, by_category, results[0].samples)
