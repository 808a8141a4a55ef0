"""Evaluate a causal LM on records: generation metrics and perplexity, per category too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from fedtune.config import EvalConfig
from fedtune.data.records import Record
from fedtune.data.templates import TemplateName, build_prompt
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.eval.runner import evaluate_generation, perplexity

GENERATION_METRICS = ("rougeL", "dist3", "dist4", "exact_match", "numeric_accuracy")


@dataclass
class EvalResult:
    metrics: dict[str, float]
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, str]] = field(default_factory=list)


def evaluate_lm(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[Record],
    settings: EvalConfig,
    *,
    template: TemplateName,
    max_length: int,
    seed: int,
) -> EvalResult:
    records = list(records)
    metrics: dict[str, float] = {}
    by_category: dict[str, dict[str, float]] = {}
    samples: list[dict[str, str]] = []
    wanted = [m for m in settings.metrics if m in GENERATION_METRICS]
    if wanted:
        generated = evaluate_generation(
            model,
            tokenizer,
            [build_prompt(rec, template, tokenizer) for rec in records],
            [rec.output for rec in records],
            [rec.category for rec in records],
            metrics=wanted,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=seed,
        )
        metrics.update({m: float(generated[m]) for m in wanted if m in generated})
        by_category.update(generated.get("by_category", {}))
        samples = [
            {"prompt": p, "prediction": pred, "reference": ref}
            for p, pred, ref in generated.get("samples", [])
        ]
    if "perplexity" in settings.metrics:
        examples = encode_records(records, tokenizer, template, max_length)
        pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        batches = make_batches(examples, settings.batch_size, pad, seed=0, bucketing=True, shuffle=False)
        metrics["perplexity"] = float(perplexity(model, batches))
    return EvalResult(metrics, by_category, samples)


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
