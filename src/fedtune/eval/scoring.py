"""Evaluation runners: perplexity, multiple-choice and classification accuracy, generation metrics.

Each runner puts the model in eval mode under ``torch.inference_mode`` and restores its training
flag afterwards, so it can run between federated rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from fedtune.decode.generate import (
    DecodeOptions,
    cache_keyword,
    evaluating,
    forward_parameters,
    generate_texts,
    model_device,
    output_cache,
    pad_sequences,
    pad_token_id,
    positions_from_mask,
)
from fedtune.eval.code_exec import pass_at_1
from fedtune.eval.metrics import (
    by_category,
    choice_hits,
    choice_predictions,
    dist_n,
    exact_match,
    mean,
    numeric_accuracy,
    perplexity_from_nll,
    rouge_l,
)
from fedtune.suggest import closest
from fedtune.train.losses import head_at_positions

if TYPE_CHECKING:
    from typing import Unpack

IGNORE_INDEX = -100
NUM_SAMPLES = 5

PER_EXAMPLE_METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], list[float]]] = {
    "rougeL": rouge_l,
    "exact_match": exact_match,
    "numeric_accuracy": numeric_accuracy,
}
# Per-example metrics that need each example's record id rather than its reference text:
# ``(predictions, record_ids) -> scores``. pass_at_1 finds the HumanEval tests by task id.
RECORD_METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], list[float]]] = {
    "pass_at_1": pass_at_1,
}
CORPUS_METRICS: dict[str, Callable[[Sequence[str]], float]] = {
    "dist3": partial(dist_n, n=3),
    "dist4": partial(dist_n, n=4),
}
GENERATION_METRICS = (*PER_EXAMPLE_METRICS, *RECORD_METRICS, *CORPUS_METRICS)
# Log-likelihood of each choice after the prompt (lm-eval's multiple-choice metrics); they need
# records with choices.
CHOICE_METRICS = ("acc", "acc_norm")


def label_log_likelihoods(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed log-likelihood of the labelled tokens per row and how many there are.

    ``logits [B,S,V]`` and ``labels [B,S]`` are aligned as in HF (``labels[t]`` is token ``t``,
    ``IGNORE_INDEX`` where unscored); position ``t`` predicts ``t + 1``, so the shift is done here.
    Returns ``(log_likelihood [B], num_tokens [B])``.
    """
    targets = labels[:, 1:]
    token_nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    return -token_nll.sum(dim=-1), (targets != IGNORE_INDEX).sum(dim=-1)


def batch_log_likelihoods(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """``label_log_likelihoods`` of ``model`` on ``input_ids``, ``labels`` and optional ``attention_mask``.

    Positions come from the mask so left- and right-padded batches score the same.
    """
    device = model_device(model)
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch.get("attention_mask", torch.ones_like(input_ids)).to(device)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask)
    ).logits
    return label_log_likelihoods(logits, batch["labels"].to(device))


def _keeps_logits(model: nn.Module) -> bool:
    return "logits_to_keep" in forward_parameters(model)


def _reads_prompts_once(model: nn.Module) -> bool:
    """Whether a question's prompt can be read once for all its choices: the model takes a key/value
    cache to continue from, and runs its head at chosen positions only (else the prompt's own logits
    would cost what reading it twice saves)."""
    return cache_keyword(model) is not None and _keeps_logits(model)


def scored_log_likelihoods(
    model: nn.Module,
    batch: Mapping[str, Tensor],
    *,
    cache: Any = None,
    cached_mask: Tensor | None = None,
) -> Tensor:
    """``batch_log_likelihoods(...)[0]`` with the LM head run only at the positions that predict a
    scored token (a choice is a few tokens at the end of a long prompt: with Gemma-3's 262k-token
    head, the full ``[B, T, V]`` logits cost more than the rest of the model). Models whose forward
    takes no ``logits_to_keep`` get the full logits.

    With ``cache`` (key/values of tokens that come before every row, ``cached_mask [B, C]`` marking
    the real ones among them), each row continues its cached tokens: positions and attention count
    them, and the first scored token must come after the row's first token here.
    """
    if cache is None and not _keeps_logits(model):
        return batch_log_likelihoods(model, batch)[0]
    device = model_device(model)
    labels = batch["labels"].to(device)
    predicting = (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().flatten()
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch.get("attention_mask", torch.ones_like(input_ids)).to(device)
    positions = positions_from_mask(attention_mask)
    extra: dict[str, Any] = {}
    if cache is not None and cached_mask is not None:
        cached_mask = cached_mask.to(device)
        positions = positions + cached_mask.sum(dim=-1, keepdim=True)
        attention_mask = torch.cat([cached_mask, attention_mask], dim=-1)
        extra = {str(cache_keyword(model)): cache, "use_cache": True}
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        logits_to_keep=predicting,
        **extra,
    ).logits
    targets = labels[:, predicting + 1]
    token_nll = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return -token_nll.view(targets.shape).sum(dim=-1)


def sequence_nll(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[float, int]:
    """Total negative log-likelihood of the batch's labelled tokens and their count.

    The LM head runs only at the positions that predict a labelled token (``head_at_positions``): the
    full ``[B, T, V]`` logits and their log-softmax are never built. For SmolLM2 (V = 49,152) at the
    demo's 16 x 128 tokens those were two 403 MB tensors, the run's peak memory (docs/memory.md).
    Families without such a head score the full logits.
    """
    wrapped: Any = model
    base: Any = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
    head = head_at_positions(base)
    if head is None:
        with evaluating(model):
            log_likelihood, num_tokens = batch_log_likelihoods(model, batch)
        return -float(log_likelihood.sum()), int(num_tokens.sum())
    device = model_device(model)
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch.get("attention_mask", torch.ones_like(input_ids)).to(device)
    targets = batch["labels"].to(device)[:, 1:]
    scored = targets != IGNORE_INDEX
    with evaluating(model):
        hidden = base.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        nll = F.cross_entropy(head(hidden[:, :-1][scored]).float(), targets[scored], reduction="sum")
    return float(nll), int(scored.sum())


def perplexity(model: nn.Module, batches: Iterable[Mapping[str, Tensor]]) -> float:
    """Token-level perplexity over all batches: every labelled token weighs the same."""
    total_nll, total_tokens = 0.0, 0
    for batch in batches:
        nll, num_tokens = sequence_nll(model, batch)
        total_nll += nll
        total_tokens += num_tokens
    return perplexity_from_nll(total_nll, total_tokens)


def choice_example(
    tokenizer: PreTrainedTokenizerBase, context: str, continuation: str, max_length: int | None = None
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` scoring ``continuation`` after ``context``, split as lm-eval does.

    Trailing whitespace of the context moves to the continuation (BPE vocabularies attach spaces
    to the following word), the pair is tokenized whole so merges across the boundary match what
    the model would see, and the context's own token count decides where scoring starts. For the
    templates' prompts (they end in a newline) and the zoo's tokenizers these are exactly the tokens
    training puts before EOS. Past ``max_length`` tokens the context loses its first tokens, as
    training cuts a long prompt from the left.
    """
    num_spaces = len(context) - len(context.rstrip())
    if num_spaces:
        context, continuation = context[:-num_spaces], context[-num_spaces:] + continuation
    input_ids: list[int] = tokenizer(context + continuation)["input_ids"]
    context_length = len(tokenizer(context)["input_ids"])
    if context_length >= len(input_ids):
        raise ValueError(f"choice {continuation!r} adds no tokens after its prompt")
    labels = [IGNORE_INDEX] * context_length + input_ids[context_length:]
    if max_length is not None:
        return input_ids[-max_length:], labels[-max_length:]
    return input_ids, labels


def choice_log_likelihoods(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    choices: Sequence[Sequence[str]],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
    share_prompts: bool = True,
) -> list[list[float]]:
    """Summed log-likelihood of every choice given its prompt, one list per prompt.

    A model that takes a key/value cache reads each question's prompt once for all its choices
    (``shared_prompt_log_likelihoods``; ``share_prompts=False`` turns that off); any other scores
    every (prompt, choice) pair whole, in batches of ``batch_size``, longest first so that a batch
    holds sequences of similar length. The result keeps the input order.
    """
    examples = [
        [choice_example(tokenizer, prompt, choice, max_length) for choice in options]
        for prompt, options in zip(prompts, choices, strict=True)
    ]
    pad_id = pad_token_id(tokenizer)
    if share_prompts and _reads_prompts_once(model):
        return shared_prompt_log_likelihoods(model, examples, pad_id, batch_size=batch_size)
    flat = [example for question in examples for example in question]
    order = sorted(range(len(flat)), key=lambda index: -len(flat[index][0]))
    scores = [0.0] * len(flat)
    with evaluating(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = _padded_batch([flat[i] for i in chunk], pad_id)
            for index, score in zip(chunk, scored_log_likelihoods(model, batch).tolist(), strict=True):
                scores[index] = score
    grouped, offset = [], 0
    for question in examples:
        grouped.append(scores[offset : offset + len(question)])
        offset += len(question)
    return grouped


def _padded_batch(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Tensor]:
    input_ids, attention_mask = pad_sequences([ids for ids, _ in examples], pad_id, side="right")
    labels, _ = pad_sequences([labels for _, labels in examples], IGNORE_INDEX, side="right")
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def shared_prefix(question: Sequence[tuple[list[int], list[int]]]) -> int:
    """How many leading tokens a question's choices can share from a cache: those before the last
    token that every choice's sequence has in common and none scores. The last shared token stays
    with the choices, whose logits at it predict their first scored token."""
    first_ids = question[0][0]
    common = min(len(ids) for ids, _ in question)
    for ids, labels in question:
        unscored = next((t for t, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
        same = next((t for t in range(common) if ids[t] != first_ids[t]), common)
        common = min(common, unscored, same)
    return max(common - 1, 0)


def shared_prompt_log_likelihoods(
    model: nn.Module,
    examples: Sequence[Sequence[tuple[list[int], list[int]]]],
    pad_id: int,
    *,
    batch_size: int = 16,
) -> list[list[float]]:
    """Choice log-likelihoods with each question's prompt read once: the prompt's key/values are
    computed a single time and every choice continues from a copy of them, so a question of n choices
    costs one prompt plus n short continuations instead of n prompts (on yes/no tasks, about half).

    ``examples`` holds per question its choices' ``(input_ids, labels)`` from ``choice_example``.
    Questions with the same number of choices go together, about ``batch_size`` sequences a batch:
    their prompts left-padded, their choices right-padded after them. The scores equal those of the
    whole sequences up to float rounding.
    """
    scores: list[list[float]] = [[] for _ in examples]
    by_count: dict[int, list[int]] = {}
    for index, question in enumerate(examples):
        by_count.setdefault(len(question), []).append(index)
    with evaluating(model):
        for count, indices in by_count.items():
            indices = sorted(indices, key=lambda i: -max(len(ids) for ids, _ in examples[i]))
            per_batch = max(1, batch_size // count)
            for start in range(0, len(indices), per_batch):
                chunk = indices[start : start + per_batch]
                cuts = [shared_prefix(examples[i]) for i in chunk]
                if max(cuts) == 0:  # nothing to share: the whole sequences
                    rows = [example for i in chunk for example in examples[i]]
                    values = scored_log_likelihoods(model, _padded_batch(rows, pad_id)).tolist()
                else:
                    prompts = [examples[i][0][0][:cut] for i, cut in zip(chunk, cuts, strict=True)]
                    cache, prompt_mask = _prompt_cache(model, prompts, pad_id, count)
                    rows = [
                        (ids[cut:], labels[cut:])
                        for i, cut in zip(chunk, cuts, strict=True)
                        for ids, labels in examples[i]
                    ]
                    values = scored_log_likelihoods(
                        model,
                        _padded_batch(rows, pad_id),
                        cache=cache,
                        cached_mask=prompt_mask,
                    ).tolist()
                for offset, i in enumerate(chunk):
                    scores[i] = values[offset * count : (offset + 1) * count]
    return scores


def _prompt_cache(
    model: nn.Module, prompts: Sequence[list[int]], pad_id: int, copies: int
) -> tuple[Any, Tensor]:
    """The key/values of ``prompts`` (left-padded, read once), each repeated ``copies`` times in a row,
    and the matching ``[len(prompts) * copies, P]`` mask of their real tokens."""
    device = model_device(model)
    prompt_ids, prompt_mask = pad_sequences(prompts, pad_id, side="left")
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    output = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions_from_mask(prompt_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = output_cache(output)
    cache.batch_repeat_interleave(copies)
    return cache, prompt_mask.repeat_interleave(copies, dim=0)


@dataclass(frozen=True)
class ChoiceScores:
    """Per question: ``hits[metric]`` (1.0 / 0.0 for ``acc`` and ``acc_norm``) and ``predicted``,
    the index of the choice ``acc`` picks."""

    hits: dict[str, list[float]]
    predicted: list[int]


def multiple_choice_scores(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    choices: Sequence[Sequence[str]],
    answers: Sequence[int],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
) -> ChoiceScores:
    """``acc`` and ``acc_norm`` of every question from one log-likelihood pass over its choices
    (the two rules: ``metrics.choice_predictions``)."""
    scores = choice_log_likelihoods(
        model, tokenizer, prompts, choices, batch_size=batch_size, max_length=max_length
    )
    predicted = choice_predictions(scores, choices)
    hits = {
        "acc": choice_hits(predicted, answers),
        "acc_norm": choice_hits(choice_predictions(scores, choices, normalize=True), answers),
    }
    return ChoiceScores(hits, predicted)


def multiple_choice_accuracy(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    choices: Sequence[Sequence[str]],
    answers: Sequence[int],
    *,
    normalize: bool = False,
    batch_size: int = 16,
) -> float:
    """Share of prompts whose highest-likelihood choice is the answer (lm-eval ``acc``).

    ``normalize`` divides each choice's log-likelihood by its length in characters first
    (lm-eval ``acc_norm``), which stops short choices winning merely for having fewer tokens.
    """
    scores = multiple_choice_scores(model, tokenizer, prompts, choices, answers, batch_size=batch_size)
    return mean(scores.hits["acc_norm" if normalize else "acc"])


def classification_accuracy(model: nn.Module, batches: Iterable[Mapping[str, Tensor]]) -> float:
    """Accuracy of a sequence-classification model; every other key of a batch goes to the model."""
    device = model_device(model)
    num_correct, num_examples = 0, 0
    with evaluating(model):
        for batch in batches:
            inputs = {key: value.to(device) for key, value in batch.items() if key != "labels"}
            predicted = model(**inputs).logits.argmax(dim=-1)
            num_correct += int((predicted == batch["labels"].to(device)).sum())
            num_examples += batch["labels"].numel()
    if num_examples == 0:
        raise ValueError("classification accuracy of no examples")
    return num_correct / num_examples


def check_metric_names(metrics: Sequence[str]) -> None:
    for name in metrics:
        if name not in GENERATION_METRICS:
            close = closest(name, GENERATION_METRICS)
            hint = f"; did you mean {close!r}?" if close else ""
            raise ValueError(f"unknown metric {name!r}{hint} (choose from {', '.join(GENERATION_METRICS)})")


def score_generations(
    prompts: Sequence[str],
    predictions: Sequence[str],
    references: Sequence[str],
    categories: Sequence[str],
    metrics: Sequence[str],
    *,
    record_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Requested metric means, per-category means of the per-example metrics and the first samples.

    ``{"rougeL": 0.41, ..., "by_category": {"rougeL": {"qa": 0.5}}, "samples": [(prompt, prediction,
    reference), ...]}``; corpus metrics (``dist3``, ``dist4``) have no per-category entry.
    ``record_ids`` are needed only by the ``RECORD_METRICS`` (``pass_at_1``).
    """
    check_metric_names(metrics)
    if not len(prompts) == len(predictions) == len(references) == len(categories):
        raise ValueError("prompts, predictions, references and categories differ in length")
    if record_ids is not None and len(record_ids) != len(predictions):
        raise ValueError("record_ids and predictions differ in length")
    report: dict[str, Any] = {}
    per_category: dict[str, dict[str, float]] = {}
    for name in metrics:
        if name in CORPUS_METRICS:
            report[name] = CORPUS_METRICS[name](predictions)
            continue
        if name in RECORD_METRICS:
            if record_ids is None:
                raise ValueError(f"metric {name!r} needs the records' ids: pass record_ids=")
            scores = RECORD_METRICS[name](predictions, record_ids)
        else:
            scores = PER_EXAMPLE_METRICS[name](predictions, references)
        report[name] = mean(scores)
        per_category[name] = by_category(scores, categories)
    report["by_category"] = per_category
    report["samples"] = list(
        zip(prompts[:NUM_SAMPLES], predictions[:NUM_SAMPLES], references[:NUM_SAMPLES], strict=True)
    )
    return report


def evaluate_generation(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    references: Sequence[str],
    categories: Sequence[str],
    *,
    metrics: Sequence[str] = ("rougeL",),
    record_ids: Sequence[str] | None = None,
    **options: Unpack[DecodeOptions],
) -> dict[str, Any]:
    """Generate a response per prompt and score it against its reference (see ``score_generations``)."""
    check_metric_names(metrics)
    predictions = generate_texts(model, tokenizer, prompts, **options)
    return score_generations(prompts, predictions, references, categories, metrics, record_ids=record_ids)
