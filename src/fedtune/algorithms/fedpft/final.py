"""FedPFT's evaluation and its final model: the LoRA + head plugged into the full classifier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedtune.algorithms.exporting import Exported
from fedtune.algorithms.fedpft.wire import HEAD_PREFIXES, tuned_parameters, with_lora
from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.config import ExperimentConfig
from fedtune.data.classify import (
    ClassExample,
    class_logits,
    class_names,
    classification_batches,
    classification_metrics,
    collate_classification,
    encode_classification,
    encode_example,
    predict_classes,
)
from fedtune.data.records import Record
from fedtune.eval.evaluate import EvalResult
from fedtune.eval.metrics import by_category
from fedtune.fl.broadcast import load_npz
from fedtune.models.loading import load_encoder_classifier
from fedtune.models.surgery import load_parameters
from fedtune.resources import model_spec

TUNED_FILE = "fedpft-tuned.npz"
"""The final LoRA + head, keyed like the full model."""
INFO_FILE = "fedpft.json"
"""The layout, the parameter counts and the distillation log."""


def classification_result(
    model: nn.Module,
    examples: Sequence[ClassExample],
    records: Sequence[Record],
    num_classes: int,
    *,
    batch_size: int,
    pad_token_id: int,
) -> EvalResult:
    """Accuracy and macro-F1 of ``model`` on ``examples`` (encoded ``records``), accuracy per category."""
    batches = classification_batches(examples, batch_size, pad_token_id, seed=None)
    predicted, gold = predict_classes(model, batches)
    hits = [float(p == g) for p, g in zip(predicted, gold, strict=True)]
    categories = by_category(hits, [r.category for r in records])
    return EvalResult(
        metrics=classification_metrics(predicted, gold, num_classes),
        by_category={c: {"accuracy": v} for c, v in categories.items()},
    )


def load_final_fedpft(
    cfg: ExperimentConfig, run_dir: Path, records: Sequence[Record]
) -> tuple[Any, Any, list[str]]:
    """(the full classifier with the run's final LoRA + head, its tokenizer, the class names)."""
    tuned_file = run_dir / "artifacts" / TUNED_FILE
    if not tuned_file.is_file():
        raise FileNotFoundError(f"{tuned_file} is missing: did the run finish? (`fedtune resume {run_dir}`)")
    section = cfg.section("fedpft")
    names = class_names(cfg.data.dataset, list(records), section.labels)
    spec = model_spec(cfg.model, cfg.seed)
    base, tokenizer = load_encoder_classifier(
        spec.name, len(names), dtype="fp32", device=spec.device, cache_dir=spec.cache_path, seed=spec.seed
    )
    model = with_lora(base, cfg.lora, cfg.seed)
    state = load_npz(tuned_file)
    targets = tuned_parameters(model)
    # LoRA a run did not train (FedOT's emulator layers) stays at its no-op init; the head cannot.
    head = sorted(k for k in targets if k.startswith(HEAD_PREFIXES) and k not in state)
    if head:
        raise KeyError(f"{tuned_file}: the task head is missing ({', '.join(head)})")
    load_parameters({k: p for k, p in targets.items() if k in state}, state, str(tuned_file))
    return model.eval(), tokenizer, names


def export_classifier(cfg: ExperimentConfig, run_dir: Path, out: Path) -> Exported:
    """The full classifier with the final LoRA merged in and the trained head, as a transformers
    sequence-classification directory (class names in ``config.id2label``) with its tokenizer."""
    from fedtune.rundata import prepare_data

    model, tokenizer, names = load_final_fedpft(cfg, run_dir, prepare_data(cfg).eval_records)
    merged = model.merge_and_unload()
    merged.config.id2label = dict(enumerate(names))
    merged.config.label2id = {name: i for i, name in enumerate(names)}
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return Exported(
        f"FedPFT's final classifier ({len(names)} classes) with its LoRA merged in: a transformers "
        "sequence-classification directory (AutoModelForSequenceClassification); the head is trained "
        "directly, so there is no peft adapter that holds the whole of it",
        causal_lm=False,
    )


class ClassifierModel(FinalModel):
    """A finished FedPFT run's output: the full classifier with the final LoRA + head plugged in."""

    generates = False
    classifies = True

    def __init__(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        tuned_file = run_dir / "artifacts" / TUNED_FILE
        if not tuned_file.is_file():
            raise FinalModelError(
                f"{tuned_file} is missing: did the run finish? (`fedtune resume {run_dir}`)"
            )
        super().__init__(cfg, tokenizer=None)
        self.run_dir = run_dir
        self._loaded: tuple[Any, Any, list[str]] | None = None

    def evaluate(self, records: list[Record]) -> EvalResult:
        return evaluate_final_fedpft(self.cfg, self.run_dir, records)

    def prompt(self, record: Record) -> str:
        """What the classifier reads: the record's text (a pair record's two texts on two lines, one
        segment, where training gave them two)."""
        return f"{record.instruction}\n{record.input}" if record.input else record.instruction

    def class_log_probs(self, texts: Sequence[str]) -> tuple[list[str], Tensor]:
        """The run's class names and each text's log-probabilities over them, encoded as training does."""
        if self._loaded is None:
            from fedtune.rundata import prepare_data

            self._loaded = load_final_fedpft(self.cfg, self.run_dir, prepare_data(self.cfg).eval_records)
        model, tokenizer, names = self._loaded
        examples = [
            encode_example(Record(text, names[0]), tokenizer, 0, self.cfg.data.max_length) for text in texts
        ]
        batch = collate_classification(examples, int(tokenizer.pad_token_id or 0))
        device = next(model.parameters()).device
        with torch.inference_mode():
            logits = class_logits(model.eval(), {key: value.to(device) for key, value in batch.items()})
        return names, torch.log_softmax(logits.float(), dim=-1)

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        raise FinalModelError(
            "FedPFT's final model is a sequence classifier (an encoder with a class head): it gives one "
            "distribution over the run's classes per text, no next-token logits, so it cannot score the "
            "log-likelihood of text; it scores multiple-choice tasks whose choices are its class names "
            "(fedtune-wordnet-lexclass), and `fedtune eval RUN` scores it (accuracy, macro-F1)"
        )


def evaluate_final_fedpft(cfg: ExperimentConfig, run_dir: Path, records: Sequence[Record]) -> EvalResult:
    """``fedtune eval`` of a FedPFT run: the plugged-in full model on ``records``."""
    model, tokenizer, names = load_final_fedpft(cfg, run_dir, records)
    examples = encode_classification(records, tokenizer, names, cfg.data.max_length)
    return classification_result(
        model,
        examples,
        records,
        len(names),
        batch_size=cfg.eval.batch_size,
        pad_token_id=int(tokenizer.pad_token_id or 0),
    )
