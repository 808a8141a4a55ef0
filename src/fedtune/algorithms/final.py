"""A finished run's model, loaded for use: what ``fedtune eval`` and ``fedtune generate`` work on.

Every method says what its final model is through two hooks of ``Algorithm``: ``final_adapter``
(a LoRA adapter on the run's ``model:``, saved here as a standard peft directory and loaded back by
``load_adapter_model``) or, when the final model is something else, ``write_artifacts`` +
``final_model`` returning its own ``FinalModel``. A final model that can decode token by token says how
(``FinalModel.decoder``), and ``FinalModel.stream`` then streams its text (``fedtune serve``).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedtune.config import ExperimentConfig
from fedtune.data.records import Record
from fedtune.errors import RunError
from fedtune.eval.evaluate import EvalResult, evaluate_lm
from fedtune.resources import Resources, model_spec

if TYPE_CHECKING:
    from torch import Tensor

    from fedtune.decode.generate import StepFn

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


@dataclass(frozen=True)
class Decoder:
    """What decoding a final model token by token needs: a fresh ``StepFn`` per continuation (the model
    in eval mode), the ids that end a continuation and the device its logits live on."""

    step_fn: Callable[[], StepFn]
    eos_token_ids: list[int]
    device: Any


@contextmanager
def intact_artifacts(run_dir: Path) -> Iterator[None]:
    """Turn a damaged tensor file of the run's final model (cut short, overwritten) into a
    ``FinalModelError`` that names the file, instead of the reader's bare ``SafetensorError``."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        raise FinalModelError(damaged_artifacts_message(run_dir, exc)) from None


def damaged_artifacts_message(run_dir: Path, error: Exception) -> str:
    from safetensors import safe_open

    damaged = []
    for path in sorted((run_dir / "artifacts").rglob("*.safetensors")):
        try:
            with safe_open(str(path), "np"):
                pass
        except Exception:
            damaged.append(str(path))
    where = ", ".join(damaged) or f"a tensor file under {run_dir / 'artifacts'}"
    return (
        f"the run's final model is damaged: {where} cannot be read ({error}). The run's artifacts were cut "
        "short or changed after it finished; run it again (or restore the run directory from a copy)"
    )


class FinalModel(ABC):
    """What a finished run produced, ready to evaluate and (where it is a language model) generate."""

    generates: ClassVar[bool] = True
    """False for a model that scores but writes no text (e.g. a classifier)."""
    classifies: ClassVar[bool] = False
    """True for a classifier: it gives ``class_log_probs`` instead of ``labelled_logits``."""

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

    def decoder(self) -> Decoder | None:
        """How to decode token by token (``stream``), or None for a model that only has ``generate``."""
        return None

    def prompt(self, record: Record) -> str:
        """The text the model reads before its answer to ``record``: the run's template applied."""
        from fedtune.data.templates import build_prompt

        return build_prompt(record, self.cfg.data.template, self.tokenizer)

    def class_log_probs(self, texts: Sequence[str]) -> tuple[list[str], Tensor]:
        """A classifier's (``classifies``) class names and each text's log-probabilities ``[B, C]``."""
        raise FinalModelError(f"the final model of a {self.cfg.algorithm!r} run is no classifier")

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Next-token logits ``[N, V]`` at the ``N`` positions ``t`` of ``batch`` (``input_ids``,
        ``attention_mask``, ``labels``, each ``[B, T]``) with ``labels[t + 1] != -100``, in row-major
        order (``train.losses.labelled_logits``): what scoring text by its log-likelihood needs
        (``fedtune eval --harness lm-eval``). A model that does not give them says why."""
        raise FinalModelError(
            f"the final model of a {self.cfg.algorithm!r} run gives no next-token logits, so it cannot "
            "score the log-likelihood of text"
        )

    def context_length(self) -> int | None:
        """The most tokens (prompt and continuation) the model takes, or None where none is known."""
        return None

    def stream(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        stop: Sequence[str] = (),
    ) -> Iterator[str]:
        """The continuation of one prompt (already templated) as text deltas, token by token where the
        model has a ``decoder`` (``TextStream``: ``finish_reason`` and ``new_tokens`` once it ends), else
        ``generate``'s whole text cut at the first stop string, in one piece."""
        from fedtune.decode.generate import TextStream, cut_at_stop

        decoder = self.decoder()
        if decoder is None:
            (text,) = self.generate(
                [prompt], max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
            )
            return iter([cut_at_stop(text, stop)] if text else [])
        return TextStream(
            decoder.step_fn(),
            self.tokenizer,
            self.tokenizer(prompt)["input_ids"],
            device=decoder.device,
            eos_token_ids=decoder.eos_token_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop_strings=stop,
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

    def context_length(self) -> int | None:
        from fedtune.decode.generate import context_length

        return context_length(self.model)

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        from fedtune.decode.generate import evaluating, model_device
        from fedtune.train.losses import labelled_logits

        device = model_device(self.model)
        with evaluating(self.model):
            logits, _ = labelled_logits(self.model, {key: value.to(device) for key, value in batch.items()})
        return logits

    def decoder(self) -> Decoder:
        from fedtune.decode.generate import eos_token_ids, model_device, model_step_fn

        model = self.model.eval()
        return Decoder(
            lambda: model_step_fn(model), eos_token_ids(model, self.tokenizer), model_device(model)
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


def load_base_model(cfg: ExperimentConfig, *, quantized: bool = True) -> tuple[Any, Any]:
    """The run's base model and tokenizer, from where the run loaded them (cache dir, GGUF file), and
    quantised as the run trained on it (``model.quantization``).

    ``quantized=False``: the same weights unquantised, in ``model.dtype``: what the final adapter is
    merged into (``fedtune.models.lora.merge_lora``), since merging into 4- or 8-bit weights would
    round every merged weight back to 4 or 8 bits.
    """
    spec = model_spec(cfg.model, cfg.seed)
    return (spec if quantized else spec.replace(quantization=None)).load_causal_lm()


def save_adapter_model(
    cfg: ExperimentConfig, resources: Resources, adapter: Mapping[str, np.ndarray], directory: Path
) -> None:
    """``adapter`` on the run's ``model:`` as a standard peft directory ``directory/adapter``."""
    from fedtune.modelcard import base_model_of, save_peft_adapter
    from fedtune.models.lora import load_adapter

    model, _ = resources.lora_lm()
    load_adapter(model, adapter)
    save_peft_adapter(model, directory / ADAPTER_DIR, base_model_of(cfg.model))
    meta = {"base_model": cfg.model.name, "template": cfg.data.template, "algorithm": cfg.algorithm}
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))


def load_adapter_model(cfg: ExperimentConfig, run_dir: Path, adapter: str = ADAPTER_DIR) -> CausalLMModel:
    """The run's base model with the peft adapter in ``run_dir/artifacts/<adapter>`` (``adapter``: the
    final one by default; a method may save others beside it, e.g. FedPT's ``adapter-distilled``)."""
    from peft import PeftModel

    adapter_dir = run_dir / "artifacts" / adapter
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
