"""Batched text generation with our own KV-cached decode loop.

``model.generate`` is not used because proxy-tuned decoding combines the logits of several models
at every step: it plugs a different ``StepFn`` into the same ``decode_loop`` and ``decode_texts``.
Greedy output matches ``model.generate(do_sample=False)`` token for token.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from typing import Unpack  # only in annotations, which are never evaluated: Python 3.10 has none

StepFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""``(new_ids [B,T], attention_mask [B,S], position_ids [B,T]) -> next-token logits [B,V]``.

``S`` counts every token so far including ``new_ids``. A step function keeps its own KV cache,
so it is fed only the tokens it has not seen: the whole prompt first, then one token per step.
"""

StopFn = Callable[[Tensor], Tensor]
"""``(new_tokens [B,N]) -> stop [B]`` (bool): an extra per-row stopping rule, e.g. stop strings."""

ProgressFn = Callable[[int, int], None]
"""``(num_done, num_total)``, called after each batch."""

_WATCHER: ContextVar[ProgressFn | None] = ContextVar("fedtune_decode_progress", default=None)


@contextmanager
def watching(progress: ProgressFn) -> Iterator[None]:
    """Inside the block, every ``decode_texts`` call without a ``progress`` of its own reports to
    ``progress`` after each batch: how ``fedtune eval`` and a run's live display show a long evaluation's
    generation, whichever decoder (a plain LM, a proxy-tuned pair, FedPT's) the final model plugs in.
    Context-local: a thread or task started elsewhere does not report here."""
    token = _WATCHER.set(progress)
    try:
        yield
    finally:
        _WATCHER.reset(token)


class DecodeOptions(TypedDict, total=False):
    """How `decode_texts` generates, as every generating entry point takes and forwards it
    (`generate_texts`, ``ProxyTunedLM.generate``, ``evaluate_generation``); a key left out takes
    `decode_texts`' default."""

    max_new_tokens: int
    batch_size: int
    temperature: float
    top_p: float
    seed: int
    stop_strings: Sequence[str] | None
    progress: ProgressFn | None


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and no autograd inside the block; the training flag is restored afterwards.

    Evaluation runs between training rounds, so the model must come back in the mode it was in.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        model.train(was_training)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where a transformers config states the longest sequence the model takes, by architecture."""


def context_length(model: Any) -> int | None:
    """The most tokens (prompt and continuation) ``model`` takes, from its config (the text model's, for
    a multimodal one); None when the config states none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for field in CONTEXT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def forward_parameters(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The parameters of the forward of ``model`` (of its base model when it is a PEFT wrapper)."""
    wrapped: Any = model
    base: Any = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
    return inspect.signature(base.forward).parameters


def cache_keyword(model: nn.Module) -> str | None:
    """The keyword the model's forward takes a key/value cache under: ``cache`` (recent transformers,
    where ``past_key_values`` is deprecated), ``past_key_values`` (earlier), or None."""
    parameters = forward_parameters(model)
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def output_cache(output: Any) -> Any:
    """The key/value cache a forward returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, else its EOS id (many causal LM tokenizers define no pad token)."""
    token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if token_id is None:
        raise ValueError("tokenizer has neither a pad nor an EOS token")
    return int(token_id)


def eos_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS plus any in the model's generation config (chat models often list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(token_id) for token_id in configured)
    if not ids:
        raise ValueError("no EOS token: neither the tokenizer nor the generation config defines one")
    return sorted(ids)


def pad_sequences(
    sequences: Sequence[Sequence[int]], pad_id: int, *, side: Literal["left", "right"]
) -> tuple[Tensor, Tensor]:
    """Pad token id lists into ``(input_ids [B,L], attention_mask [B,L])``, ``L`` the longest row."""
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        span = slice(length - len(sequence), length) if side == "left" else slice(0, len(sequence))
        input_ids[row, span] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, span] = 1
    return input_ids, attention_mask


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token counting real tokens only: ``[B,S] -> [B,S]``, padding gets 0.

    Without this a left-padded row would start at position ``num_pads`` and decode differently
    from the same prompt unpadded; it is also ``generate``'s convention.
    """
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``: ``[B,V] -> [B,V]``.

    Dropped tokens get ``-inf``; the most likely token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> Tensor:
    """Next token per row, ``[B,V] -> [B]``: argmax when ``temperature == 0``, else a draw from the
    tempered, top-p filtered distribution using ``generator``."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_p < 1.0:
        scaled = top_p_filter(scaled, top_p)
    return torch.multinomial(scaled.softmax(dim=-1), num_samples=1, generator=generator).squeeze(-1)


def model_step_fn(model: nn.Module) -> StepFn:
    """A ``StepFn`` running a causal LM incrementally; each call makes a fresh KV cache.

    ``logits_to_keep=1`` spares the ``[B,P,V]`` prompt logits, which for a 150k vocabulary would
    dwarf the model's activations.
    """
    cache: object = None
    keyword = cache_keyword(model) or "past_key_values"

    def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        nonlocal cache
        output = model(
            input_ids=new_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{keyword: cache},
        )
        cache = output_cache(output)
        logits: Tensor = output.logits[:, -1, :].float()
        return logits

    return step


def decode_loop(
    step_fn: StepFn,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    should_stop: StopFn | None = None,
) -> Tensor:
    """Continue a left-padded batch ``input_ids [B,P]``: new tokens ``[B,N]``, ``N <= max_new_tokens``.

    A row stops after emitting an EOS token or when ``should_stop`` says so, and is then filled
    with ``pad_token_id``; the loop ends early once every row has stopped.
    """
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device)
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    position_ids = positions_from_mask(attention_mask)
    new_ids = input_ids
    generated: list[Tensor] = []
    for _ in range(max_new_tokens):
        logits = step_fn(new_ids, attention_mask, position_ids)
        token = sample_next(logits, temperature, top_p, generator).masked_fill(finished, pad_token_id)
        generated.append(token)
        finished |= torch.isin(token, eos)
        if should_stop is not None:
            finished |= should_stop(torch.stack(generated, dim=1))
        if bool(finished.all()):
            break
        new_ids = token[:, None]
        position_ids = position_ids[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((input_ids.shape[0], 1))], dim=1)
    if not generated:
        return input_ids.new_empty((input_ids.shape[0], 0))
    return torch.stack(generated, dim=1)


def stop_string_fn(tokenizer: PreTrainedTokenizerBase, stop_strings: Sequence[str]) -> StopFn:
    """A ``StopFn`` that fires once a row's decoded new text contains any of ``stop_strings``.

    Decoding the whole continuation each step (not token by token) catches stop strings that
    span tokens or sit inside a multi-byte character.
    """

    def should_stop(new_tokens: Tensor) -> Tensor:
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        hits = [any(stop in text for stop in stop_strings) for text in texts]
        return torch.tensor(hits, dtype=torch.bool, device=new_tokens.device)

    return should_stop


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cut = min((index for stop in stop_strings if (index := text.find(stop)) >= 0), default=len(text))
    return text[:cut]


def check_sampling(temperature: float, top_p: float) -> None:
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def decode_texts(
    make_step_fn: Callable[[], StepFn],
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    device: torch.device,
    eos_token_ids: Sequence[int],
    max_new_tokens: int = 64,
    batch_size: int = 8,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_strings: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
) -> list[str]:
    """Generate a continuation per prompt with fresh step functions from ``make_step_fn`` (one per batch).

    Prompts are batched longest first, which keeps padding small and surfaces out-of-memory
    errors on the first batch; the results come back in the order of ``prompts``.
    """
    check_sampling(temperature, top_p)
    if not prompts:
        return []
    prompt_ids: list[list[int]] = tokenizer(list(prompts))["input_ids"]
    order = sorted(range(len(prompts)), key=lambda index: len(prompt_ids[index]), reverse=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    pad_id = pad_token_id(tokenizer)
    should_stop = stop_string_fn(tokenizer, stop_strings) if stop_strings else None
    texts = [""] * len(prompts)
    progress = progress or _WATCHER.get()
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        input_ids, attention_mask = pad_sequences([prompt_ids[row] for row in rows], pad_id, side="left")
        new_tokens = decode_loop(
            make_step_fn(),
            input_ids.to(device),
            attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_id,
            temperature=temperature,
            top_p=top_p,
            generator=generator,
            should_stop=should_stop,
        )
        for row, text in zip(rows, tokenizer.batch_decode(new_tokens, skip_special_tokens=True), strict=True):
            texts[row] = cut_at_stop(text, stop_strings or ())
        if progress is not None:
            progress(start + len(rows), len(prompts))
    return texts


def generate_texts(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    **options: Unpack[DecodeOptions],
) -> list[str]:
    """The new text a causal LM writes after each prompt, special tokens removed, cut before any stop string.

    Greedy when ``temperature == 0``, else seeded sampling; sampled output depends on
    ``batch_size`` because batches share one random generator.
    """
    with evaluating(model):
        return decode_texts(
            lambda: model_step_fn(model),
            tokenizer,
            prompts,
            device=model_device(model),
            eos_token_ids=eos_token_ids(model, tokenizer),
            **options,
        )


class TextStream:
    """One prompt's continuation as text deltas, one model step per ``next()`` (what a streaming API sends).

    Every step runs under its own ``torch.inference_mode()`` and keeps nothing else of the thread's
    state between steps, so several streams may take turns on one thread (a server's model worker).
    The concatenated deltas equal what ``decode_texts`` returns for the prompt alone with the same
    arguments (greedy, or sampled with the same ``seed``): the same step function, sampler and stop
    rules. A delta is held back while it could still be the start of a stop string or ends inside a
    multi-byte character. After the last delta, ``finish_reason`` is ``"stop"`` (EOS or a stop string)
    or ``"length"`` (``max_new_tokens`` reached) and ``new_tokens`` counts the tokens generated.
    """

    def __init__(
        self,
        step_fn: StepFn,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: Sequence[int],
        *,
        device: torch.device,
        eos_token_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_strings: Sequence[str] = (),
    ) -> None:
        check_sampling(temperature, top_p)
        if not prompt_ids:
            raise ValueError("the prompt has no tokens")
        self.step_fn, self.tokenizer = step_fn, tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.stop_strings = [s for s in stop_strings if s]
        self.eos = set(int(i) for i in eos_token_ids)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self._ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        self._mask = torch.ones_like(self._ids)
        self._positions = positions_from_mask(self._mask)
        self._tokens: list[int] = []
        self._sent = 0
        self._text = ""
        self.finish_reason: str | None = None

    @property
    def new_tokens(self) -> int:
        return len(self._tokens)

    def __iter__(self) -> Iterator[str]:
        return self

    def close(self) -> None:
        """End the stream early (a client went away); no further steps run. Safe to call from another
        thread while a step runs: the stream ends after that step."""
        if self.finish_reason is None:
            self.finish_reason = "cancelled"

    def step(self) -> str | None:
        """One model step: the text it adds ("" while held back), or None once the stream has ended."""
        if self.finish_reason is not None:
            return None
        return self._step()

    def __next__(self) -> str:
        while self.finish_reason is None:
            delta = self._step()
            if delta:
                return delta
        raise StopIteration

    def _step(self) -> str:
        if len(self._tokens) >= self.max_new_tokens:
            return self._finish("length")
        with torch.inference_mode():
            logits = self.step_fn(self._ids, self._mask, self._positions)
            token = int(sample_next(logits, self.temperature, self.top_p, self.generator)[0])
        if token in self.eos:
            return self._finish("stop")
        self._tokens.append(token)
        self._ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        self._positions = self._positions[:, -1:] + 1
        self._mask = torch.cat([self._mask, self._mask.new_ones((1, 1))], dim=1)
        self._text = str(self.tokenizer.decode(self._tokens, skip_special_tokens=True))
        if self.stop_strings and any(stop in self._text for stop in self.stop_strings):
            self._text = cut_at_stop(self._text, self.stop_strings)
            return self._finish("stop")
        if len(self._tokens) >= self.max_new_tokens:
            return self._finish("length")
        # Hold back what may still become a stop string, or a character cut in the middle.
        hold = max((len(stop) - 1 for stop in self.stop_strings), default=0)
        safe = len(self._text) - hold
        while safe > self._sent and self._text[safe - 1] == "\ufffd":
            safe -= 1
        return self._emit(safe)

    def _emit(self, upto: int) -> str:
        if upto <= self._sent:
            return ""
        delta = self._text[self._sent : upto]
        self._sent = upto
        return delta

    def _finish(self, reason: str) -> str:
        self.finish_reason = reason
        return self._emit(len(self._text))
