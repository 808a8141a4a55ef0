"""A finished run's model, loaded for use: what ``fedtune eval`` and ``fedtune generate`` work on.

Every method says what its final model is through two hooks of ``Algorithm``: ``final_adapter``
(a LoRA adapter on the run's ``model:``, saved here as a standard peft directory and loaded back by
``load_adapter_model``) or, when the final model is something else, ``write_artifacts`` +
``final_model`` returning its own ``FinalModel``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedtune.config import ExperimentConfig
from fedtune.data.records import Record
from fedtune.errors import RunError
from fedtune.eval.evaluate import EvalResult, evaluate_lm
from fedtune.resources import Resources, model_spec

ADAPTER_DIR = "adapter"
META_FILE = "meta.json"


@dataclass(frozen=True)
class FinalRun:
    """A finished run whose final model is asked for: ``variant`` is one of the method's
    ``final_variants`` (its first when none was named; ``None`` for a method without variants), and
    ``options`` hold only keys of its ``final_options``."""

    cfg: ExperimentConfig
    run_dir: Path
    variant: str | None
    options: Mapping[str, str]


class FinalModelError(RunError):
    """A finished run's model cannot be loaded or cannot do what was asked (named in the message)."""


class FinalModel(ABC):
    """What a finished run produced, ready to evaluate and (where it is a language model) generate."""

    generates: ClassVar[bool] = True
    """False for a model that scores but writes no text (e.g. a classifier)."""

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer

    @abstractmethod
    def evaluate(self, records: list[Record]) -> EvalResult:
        """Scores on ``records`` with the run's ``eval:`` settings."""

    def generate(
        self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[str]:
        """Continuations of ``prompts`` (already templated); a model that does not generate says so."""
        raise FinalModelError(
            f"the final model of a {self.cfg.algorithm!r} run does not generate text "
            "(`fedtune eval` scores it)"
        )


class CausalLMModel(FinalModel):
    """A causal language model (e.g. the base model with the final LoRA adapter)."""

    def __init__(self, cfg: ExperimentConfig, model: Any, tokenizer: Any) -> None:
        super().__init__(cfg, tokenizer)
        self.model = model

    def evaluate(self, records: list[Record]) -> EvalResult:
        return evaluate_lm(
            self.model,
            self.tokenizer,
            records,
            self.cfg.eval,
            template=self.cfg.data.template,
            max_length=self.cfg.data.max_length,
            seed=self.cfg.seed,
        )

    def generate(
        self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[str]:
        from fedtune.decode.generate import generate_texts

        return generate_texts(
            self.model,
            self.tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
        )


def load_base_model(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The run's base model and tokenizer, from where the run loaded them (cache dir, GGUF file)."""
    return model_spec(cfg.model, cfg.seed).load_causal_lm()


def save_adapter_model(
    cfg: ExperimentConfig, resources: Resources, adapter: Mapping[str, np.ndarray], directory: Path
) -> None:
    """``adapter`` on the run's ``model:`` as a standard peft directory ``directory/adapter``."""
    from fedtune.models.lora import load_adapter

    model, _ = resources.lora_lm()
    load_adapter(model, adapter)
    model.save_pretrained(str(directory / ADAPTER_DIR))
    meta = {"base_model": cfg.model.name, "template": cfg.data.template, "algorithm": cfg.algorithm}
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))


def load_adapter_model(cfg: ExperimentConfig, run_dir: Path) -> CausalLMModel:
    """The run's base model with the peft adapter in ``run_dir/artifacts/adapter``."""
    from peft import PeftModel

    adapter_dir = run_dir / "artifacts" / ADAPTER_DIR
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FinalModelError(
            f"{adapter_dir} has no adapter: did the run finish? (`fedtune resume {run_dir}`)"
        )
    model, tokenizer = load_base_model(cfg)
    return CausalLMModel(cfg, PeftModel.from_pretrained(model, str(adapter_dir)).eval(), tokenizer)


def check_variant(algorithm: str, variants: tuple[str, ...], variant: str | None) -> str | None:
    """``variant`` if ``algorithm`` names it (``None``: the first one, the default), else a clear error."""
    if variant is None:
        return variants[0] if variants else None
    if variant not in variants:
        known = f"choose {', '.join(variants)}" if variants else "it has one final model: leave --variant out"
        raise FinalModelError(f"a {algorithm!r} run has no final-model variant {variant!r}: {known}")
    return variant


def check_options(algorithm: str, known: tuple[str, ...], options: Mapping[str, str]) -> None:
    """Refuse ``--option`` keys that ``algorithm``'s final model does not take."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"it takes {', '.join(known)}" if known else "it takes none"
        raise FinalModelError(
            f"a {algorithm!r} run's final model has no option {', '.join(unknown)}: {takes}"
        )
