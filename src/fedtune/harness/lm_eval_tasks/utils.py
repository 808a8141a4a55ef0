"""The generation tasks' scores: fedtune's own metrics on one document's continuation."""

from __future__ import annotations

from typing import Any

from fedtune.eval.metrics import exact_match, numeric_accuracy, rouge_l


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    (prediction,) = results
    reference = str(doc["output"])
    return {
        "rougeL": rouge_l([prediction], [reference])[0],
        "exact_match": exact_match([prediction], [reference])[0],
        "numeric_accuracy": numeric_accuracy([prediction], [reference])[0],
    }
