"""A finished run's final model, for evaluation and generation: each method loads its own
(``Algorithm.load_final``); this module only finds the run's method and its data."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from fedtune.algorithms.final import FinalModel, FinalModelError, intact_artifacts
from fedtune.algorithms.registry import get_algorithm
from fedtune.config import ExperimentConfig, load_run_config
from fedtune.data.records import DataError, Record
from fedtune.data.templates import build_prompt
from fedtune.eval.evaluate import EvalResult
from fedtune.models.loading import parse_tiny_name
from fedtune.rundata import prepare_data


def run_config(run_dir: Path) -> ExperimentConfig:
    """The resolved config a run directory holds; a clear error for a directory that is not a run."""
    if not (run_dir / "config.yaml").is_file():
        raise DataError(f"{run_dir} is not a run directory (no config.yaml)")
    return load_run_config(run_dir)


def random_model_note(run_dir: Path) -> str | None:
    """A word for whoever reads what a run's final model generates, when its model is one of the seeded
    random test models (``tiny-*``): their text is noise or blank, and nothing is wrong."""
    name = run_config(run_dir).model.name
    if parse_tiny_name(name) is None:
        return None
    return (
        f"note: {name} is a randomly initialised test model, so what it generates means nothing; "
        "a real model (e.g. configs/demo/fedit-smollm2.yaml) writes text"
    )


def load_final(
    run_dir: Path, variant: str | None = None, options: Mapping[str, str] | None = None
) -> FinalModel:
    """The final model of the run in ``run_dir``, as its method defines it (``variant``: one of the
    method's ``final_variants``; ``options``: its ``final_options``)."""
    cfg = run_config(run_dir)
    with intact_artifacts(run_dir):
        return get_algorithm(cfg.algorithm).load_final(cfg, run_dir, variant, options)


def evaluate_run(
    run_dir: Path,
    split: str | None = None,
    max_examples: int | None = None,
    variant: str | None = None,
    options: Mapping[str, str] | None = None,
    output: str | Path = "eval.json",
) -> EvalResult:
    """The final model on the run's test set (or ``split``); writes ``output`` (a path relative to the run
    directory, or absolute), so that the scores of another variant, option or example count can sit beside
    the first instead of replacing it."""
    target = run_dir / output
    if target.is_dir():
        raise FileExistsError(f"eval output {target} is a directory: name a file")
    import torch

    started = time.perf_counter()
    final = load_final(run_dir, variant, options)
    cfg = final.cfg
    if split:
        cfg.data.eval_split = split
    if max_examples:
        cfg.eval.max_examples = max_examples
    records = prepare_data(cfg).eval_records
    result = final.evaluate(records)
    summary = {
        "split": cfg.data.eval_split,
        "variant": variant,
        "options": dict(options or {}),
        "examples": len(records),
        "metrics": result.metrics,
        "by_category": result.by_category,
        "samples": result.samples,
        "seconds": round(time.perf_counter() - started, 1),  # loading the model included
        "threads": torch.get_num_threads(),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial")
    staging.write_text(json.dumps(summary, indent=1))
    os.replace(staging, target)  # a reader never sees half a file, and a crash keeps the old one
    return result


def generate_from_run(
    run_dir: Path,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    raw: bool = False,
    variant: str | None = None,
    options: Mapping[str, str] | None = None,
) -> list[str]:
    """Continuations of ``prompts`` by the run's final model (the run's template applied unless ``raw``)."""
    final = load_final(run_dir, variant, options)
    if not final.generates:
        raise FinalModelError(
            f"{run_dir} is a {final.cfg.algorithm!r} run: its final model scores, it does not generate "
            "text (`fedtune eval`)"
        )
    texts = (
        prompts
        if raw
        else [build_prompt(Record(p, "-"), final.cfg.data.template, final.tokenizer) for p in prompts]
    )
    return final.generate(
        texts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
