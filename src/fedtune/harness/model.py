"""A finished run's final model as an lm-evaluation-harness model (``@register_model("fedtune")``).

The wrapper is method-agnostic: it asks the final model only for ``FinalModel.labelled_logits``
(next-token logits at the scored positions) and ``FinalModel.generate``. So every method's final model,
variant and option is scored the same way: FedPT's proxy-tuned decoding gives the combined logits
``z_large + alpha * (z_tuned - z_base)``, FedBiOT's AdapFu and AdapEmu, a PerFIT client's personal model
(``client=cNN``); a final model without next-token logits (FedPFT's classifier) refuses with its reason.

Requests are tokenised, split and truncated as lm-eval's ``hf`` model does (``TemplateLM``: trailing
context spaces move to the continuation, the pair is encoded whole; an empty context becomes the
prefix token), so the same task gives the same log-likelihoods as ``hf`` on the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import has_bos_prefix
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.decode.generate import cut_at_stop

DEFAULT_MAX_LENGTH = 2048
"""The context a model without a stated one is given (lm-eval's ``hf`` default)."""
IGNORE_INDEX = -100

TokenRequest = tuple[tuple[str, str], list[int], list[int]]
"""lm-eval's ``(strings, context ids, continuation ids)``."""


@register_model("fedtune")
class FedtuneLM(TemplateLM):
    """``final`` (a loaded final model) or ``run_dir`` (+ ``variant`` and the method's final options,
    e.g. ``client=c01`` or ``alpha=0.5``), scored ``batch_size`` sequences at a time (``auto``: 8).
    The run's ``model.device`` places the model: lm-eval's ``device`` and ``max_batch_size`` are
    taken and not used."""

    def __init__(
        self,
        run_dir: str | None = None,
        variant: str | None = None,
        batch_size: int | str = 8,
        max_length: int | None = None,
        final: FinalModel | None = None,
        device: str | None = None,
        max_batch_size: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if final is None:
            if run_dir is None:
                raise ValueError("the fedtune model needs run_dir=RUN (or a loaded final model)")
            from fedtune.artifacts import load_final

            options = {key: str(value) for key, value in options.items() if value is not None}
            final = load_final(Path(run_dir), variant, options)
        self.final = final
        self.tokenizer = final.tokenizer
        if self.tokenizer is None and not final.classifies:
            final.labelled_logits({})  # a model without a tokenizer scores no text: it says why
        self.batch_size = 8 if batch_size == "auto" else int(batch_size)
        self.max_length = max_length or final.context_length() or DEFAULT_MAX_LENGTH

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Each continuation's log-probability after its context (``TemplateLM``'s split and tokens);
        for a classifier, the log-probability of the class the continuation names (`class_choices`)."""
        if self.final.classifies:
            return class_choices(self.final, [request.args for request in requests], self.batch_size)
        scores: list[tuple[float, bool]] = super().loglikelihood(requests, disable_tqdm)
        return scores

    # ----- tokenisation, as lm-eval's hf model -----------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.tokenizer.eos_token_id)

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special = {"add_special_tokens": False}
        ids: list[int] = self.tokenizer.encode(string, **special)
        return ids

    # ----- log-likelihoods -----------------------------------------------------------------------
    def _loglikelihood_tokens(
        self, requests: list[TokenRequest], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Each continuation's summed log-probability after its context, and whether greedy decoding
        writes it; longest first in batches, the answers in the requests' order."""
        pairs = [
            truncated_pair(context, continuation, self.max_length) for _, context, continuation in requests
        ]
        order = sorted(range(len(pairs)), key=lambda index: -sum(map(len, pairs[index])))
        scores: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for index, score in zip(chunk, self._score([pairs[i] for i in chunk]), strict=True):
                scores[index] = score
        for (strings, _, _), score in zip(requests, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood", strings, score)
        return scores

    def _score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        batch = labelled_batch(pairs, pad_token_id(self.tokenizer))
        logits = self.final.labelled_logits(batch)
        targets = batch["labels"][:, 1:][batch["labels"][:, 1:] != IGNORE_INDEX].to(logits.device)
        logprobs = F.log_softmax(logits.float(), dim=-1)
        token_scores = logprobs.gather(-1, targets[:, None])[:, 0]
        greedy = logprobs.argmax(dim=-1) == targets
        counts = [len(continuation) for _, continuation in pairs]
        return [
            (float(row_scores.sum()), bool(row_greedy.all()))
            for row_scores, row_greedy in zip(token_scores.split(counts), greedy.split(counts), strict=True)
        ]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's whole log-likelihood after the prefix token, in disjoint windows of
        ``max_length`` tokens each with the most context (as lm-eval's hf model)."""
        if self.final.classifies:
            self.final.labelled_logits({})  # a classifier scores no text: it says why
        windows: list[TokenRequest] = []
        counts = []
        for (string,) in (request.args for request in requests):
            rolling = get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            found = [make_disjoint_window(window) for window in rolling]
            windows += [(("", ""), context, continuation) for context, continuation in found]
            counts.append(len(found))
        scores = iter(self._loglikelihood_tokens(windows))
        totals = [sum(next(scores)[0] for _ in range(count)) for count in counts]
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ----- generation ----------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, where a task asks) continuations cut at the task's ``until`` strings,
        ``batch_size`` prompts at a time among requests with the same settings."""
        texts: list[str] = [""] * len(requests)
        for settings, indices in grouped_by_settings(requests):
            until = settings.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            sampled = bool(settings.get("do_sample", False))
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                written = self.final.generate(
                    [requests[i].args[0] for i in chunk],
                    max_new_tokens=int(settings.get("max_gen_toks", 256)),
                    temperature=float(settings.get("temperature", 1.0)) if sampled else 0.0,
                    top_p=float(settings.get("top_p", 1.0)),
                    seed=self.final.cfg.seed,
                )
                for index, text in zip(chunk, written, strict=True):
                    texts[index] = cut_at_stop(text, until)
                    self.cache_hook.add_partial("generate_until", requests[index].args, texts[index])
        return texts


def class_choices(
    final: FinalModel, pairs: Sequence[tuple[str, str]], batch_size: int
) -> list[tuple[float, bool]]:
    """A classifier's answers to ``(context, continuation)`` requests: ``log p(class | context)`` for
    the class the continuation names (surrounding spaces ignored), and whether it is the top class.
    Each context is classified once, however many choices ask about it."""
    contexts = list(dict.fromkeys(context for context, _ in pairs))
    log_probs: dict[str, Any] = {}
    names: list[str] = []
    for start in range(0, len(contexts), batch_size):
        chunk = contexts[start : start + batch_size]
        names, rows = final.class_log_probs(chunk)
        log_probs.update(zip(chunk, rows, strict=True))
    scores = []
    for context, continuation in pairs:
        name = continuation.strip()
        if name not in names:
            raise FinalModelError(
                f"a {final.cfg.algorithm!r} run's final model is a classifier over {len(names)} classes "
                f"({', '.join(names[:4])}, ...); the task asks for the log-likelihood of {continuation!r}, "
                "which is none of them: it scores only multiple-choice tasks whose choices are its classes"
            )
        row = log_probs[context]
        scores.append((float(row[names.index(name)]), int(row.argmax()) == names.index(name)))
    return scores


def truncated_pair(
    context: list[int], continuation: list[int], max_length: int
) -> tuple[list[int], list[int]]:
    """``(context, continuation)`` whose whole keeps at most ``max_length + 1`` tokens (the last is
    predicted, never read), the context losing its first ones: lm-eval's hf model's cut."""
    if len(continuation) > max_length:
        raise ValueError(
            f"a continuation of {len(continuation)} tokens exceeds the {max_length}-token context"
        )
    keep = max_length + 1 - len(continuation)
    return context[-keep:] if len(context) > keep else context, continuation


def labelled_batch(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` ``[B, T]`` (right-padded): every continuation
    token labelled, nothing else."""
    width = max(len(context) + len(continuation) for context, continuation in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (context, continuation) in enumerate(pairs):
        ids = context + continuation
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, len(context) : len(ids)] = torch.tensor(continuation)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pad_token_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id or 0)


def grouped_by_settings(requests: Sequence[Any]) -> Iterator[tuple[dict[str, Any], list[int]]]:
    """The requests' indices grouped by their generation settings (first appearance order)."""
    groups: dict[str, list[int]] = {}
    settings: dict[str, dict[str, Any]] = {}
    for index, request in enumerate(requests):
        kwargs = dict(request.args[1])
        key = json.dumps(kwargs, sort_keys=True, default=str)
        groups.setdefault(key, []).append(index)
        settings[key] = kwargs
    for key, indices in groups.items():
        yield settings[key], indices
