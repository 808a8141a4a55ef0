"""A finished run's final model written in a standard format, for tools outside fedtune.

``fedtune export`` (``fedtune.export``) asks the run's method (``Algorithm.export_final``) to write its
final model as a peft adapter directory or as a transformers model directory with the adapter merged
in; GGUF is made from the merged directory by llama.cpp's converter. This module holds what methods
share: the export of a final model that is a causal LM (with or without a peft adapter) and the
errors. A method whose final model is something else writes the part that stands on its own and says
so in ``Exported.what``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedtune.algorithms.final import CausalLMModel, FinalModel, FinalModelError, FinalRun
from fedtune.modelcard import base_model_of, save_peft_adapter

METHOD_FORMATS = ("peft", "merged")
"""What ``Algorithm.export_final`` writes; ``gguf`` is converted from ``merged`` by ``fedtune.export``."""


class ExportError(FinalModelError):
    """The final model cannot be exported as asked; the message says what can be."""


@dataclass(frozen=True)
class Exported:
    """What an export wrote: ``what`` says it in a sentence (shown and saved beside the files);
    ``causal_lm``: the directory is a transformers causal LM (what GGUF conversion takes)."""

    what: str
    causal_lm: bool = True


def full_precision(run: FinalRun) -> FinalRun:
    """``run`` with its base model loaded unquantised (``model.quantization`` off): an exported model
    is merged into float weights in ``model.dtype``, which any tool (and llama.cpp's converter) reads."""
    if getattr(run.cfg.model, "quantization", None) is None:
        return run
    cfg = run.cfg.model_copy(deep=True)
    cfg.model.quantization = None
    return replace(run, cfg=cfg)


def is_peft_model(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def export_causal_lm(final: FinalModel, fmt: str, out: Path, what: str) -> Exported:
    """Write ``final`` (a causal LM, e.g. the base model with the run's LoRA) to ``out``: ``peft``, its
    adapter as a standard peft directory (``adapter_config.json`` + ``adapter_model.safetensors``, with
    the tokenizer) that ``PeftModel.from_pretrained(base, out)`` loads; ``merged``, the adapter merged
    into the base weights, a transformers model directory with its tokenizer that
    ``AutoModelForCausalLM.from_pretrained(out)`` loads. ``what`` names the model in the summary."""
    if not isinstance(final, CausalLMModel):
        raise ExportError(
            f"the final model of a {final.cfg.algorithm!r} run ({type(final).__name__}) is not a causal "
            "language model, so there is no peft or transformers directory to write"
        )
    model = final.model
    base = final.cfg.model.name
    if fmt == "peft":
        if not is_peft_model(model):
            raise ExportError(
                f"{what} of this {final.cfg.algorithm!r} run holds no LoRA adapter (its weights are trained "
                "directly): export it with --format merged"
            )
        # Named again: a run saved before adapters named their base has null or a local path there.
        save_peft_adapter(model, out, base_model_of(final.cfg.model))
        final.tokenizer.save_pretrained(str(out))
        return Exported(f"{what}: a peft LoRA adapter for the base model {base!r}")
    if fmt != "merged":
        raise ExportError(f"unknown export format {fmt!r}; a method writes {', '.join(METHOD_FORMATS)}")
    merged = model.merge_and_unload() if is_peft_model(model) else model
    merged.save_pretrained(str(out), safe_serialization=True)
    final.tokenizer.save_pretrained(str(out))
    merged_in = " with its adapter merged into the weights" if is_peft_model(model) else ""
    return Exported(f"{what}{merged_in}: a transformers model directory (base {base!r})")
