"""A finished run's final model behind OpenAI's chat and completions endpoints.

The model is whatever the run's method says its final model is (``Algorithm.final_model``, loaded by
``fedtune.artifacts.load_final``): this module never asks which method made the run. It decodes through
``FinalModel.stream``, token by token where the model has a decoder.

- ``POST /v1/chat/completions``: the messages rendered with the run's prompt template
  (``data.template``): ``chat`` renders the whole conversation with the tokenizer's chat template;
  ``alpaca`` and ``plain`` hold one instruction, so they take one user message, after any system
  messages, which are folded into the instruction before it (chat clients always send one).
- ``POST /v1/completions``: the prompt as sent, no template (a text or a list of texts).
- Both: ``max_tokens`` (completions: 16 by default, as OpenAI; chat: ``DEFAULT_CHAT_TOKENS``),
  ``temperature`` (default 1, 0 greedy), ``top_p``, ``stop`` (up to 4 strings, cut from the text),
  ``seed`` (default: a fresh one per request), ``stream`` (server-sent events ending ``data: [DONE]``);
  ``n`` must be 1, and log-probabilities are not served (``fedtune serve MODEL`` serves them for a model).

The prompt and ``max_tokens`` together must fit the model's context (``FinalModel.context_length``, its
config's, and the tokenizer's where it states one): past it the answer is 400 before any decoding.
Decoding runs one model step per turn on the worker, so requests in flight take turns, and it ends when
the client goes away (a whole response: checked between steps; a stream: the send fails) or the server
stops.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.data.records import Record
from fedtune.data.templates import build_prompt
from fedtune.decode.generate import TextStream
from fedtune.serve.app import ModelWorker, check_model, json_body, json_response, sse
from fedtune.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    bad_request,
    completion_body,
    new_id,
    now,
    parse,
)

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion request that names none (OpenAI's default)."""
DEFAULT_CHAT_TOKENS = 256
"""``max_tokens`` of a chat request that names none (OpenAI's is the context: small models need a bound)."""
SYSTEM_ROLES = ("system", "developer")
"""Roles whose text an ``alpaca`` or ``plain`` prompt folds into the instruction (OpenAI's newer models
call the system message ``developer``)."""
NO_LIMIT = 10**8
"""A tokenizer's ``model_max_length`` at or above this is transformers' "no limit" sentinel."""


def context_limit(final: FinalModel) -> int | None:
    """The most tokens a request may use: the smaller of the model's context and the tokenizer's limit
    (where either states one)."""
    tokenizer_limit = getattr(final.tokenizer, "model_max_length", None)
    limits = [final.context_length(), tokenizer_limit if isinstance(tokenizer_limit, int) else None]
    known = [limit for limit in limits if limit is not None and 0 < limit < NO_LIMIT]
    return min(known) if known else None


class RunService:
    """``final`` (a run's final model) served under ``name``."""

    def __init__(self, final: FinalModel, name: str) -> None:
        if not final.generates:
            raise FinalModelError(
                f"the final model of a {final.cfg.algorithm!r} run scores but does not generate text, so "
                "there is nothing to serve on the chat or completions endpoints (`fedtune eval` scores it)"
            )
        self.final = final
        self.name = name
        self.tokenizer = final.tokenizer
        self.template = final.cfg.data.template
        self.max_model_len = context_limit(final)

    # ----- routes ---------------------------------------------------------------------------------
    def mount(self, app: FastAPI, worker: ModelWorker) -> None:
        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = parse(CompletionRequest, await json_body(request))
            self._check(body)
            if body.echo or body.logprobs is not None or body.prompt_logprobs is not None:
                raise bad_request(
                    "echo and logprobs are not served for a run's final model "
                    "(`fedtune serve MODEL` serves a model's log-probabilities)",
                    "logprobs" if body.echo is False else "echo",
                )
            prompts = []
            for prompt in body.prompts():
                if not isinstance(prompt, str):
                    raise bad_request("send the prompt as text (token ids are not accepted here)", "prompt")
                if not prompt:
                    raise bad_request("the prompt is empty", "prompt")
                prompts.append(prompt)
            max_tokens = DEFAULT_COMPLETION_TOKENS if body.max_tokens is None else body.max_tokens
            if body.stream and len(prompts) != 1:
                raise bad_request("stream takes one prompt", "prompt")
            slot = worker.slot()
            try:
                opened = [await worker.run(self.open, body, prompt, max_tokens) for prompt in prompts]
                request.state.tokens = lambda: sum(one.total_tokens() for one in opened)
                if body.stream:
                    return sse(self._completion_chunks(worker, opened[0], request), slot)
                with slot:
                    return json_response(await self._completion(worker, opened, request))
            except BaseException:
                slot.release()
                raise

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = parse(ChatRequest, await json_body(request))
            self._check(body)
            if body.logprobs or body.top_logprobs:
                raise bad_request("logprobs are not served for a run's final model", "logprobs")
            prompt = self.render(body)
            limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
            max_tokens = DEFAULT_CHAT_TOKENS if limit is None else limit
            slot = worker.slot()
            try:
                opened = await worker.run(self.open, body, prompt, max_tokens)
                request.state.tokens = opened.total_tokens
                if body.stream:
                    usage = bool((body.stream_options or {}).get("include_usage"))
                    return sse(self._chat_chunks(worker, opened, usage, request), slot)
                with slot:
                    return json_response(await self._chat(worker, opened, request))
            except BaseException:
                slot.release()
                raise

    def _check(self, body: SamplingRequest) -> None:
        check_model(body.model, self.name)
        if body.n != 1:
            raise bad_request("n > 1 is not supported by this server", "n")

    # ----- prompts --------------------------------------------------------------------------------
    def render(self, body: ChatRequest) -> str:
        """The conversation as the prompt text the run's model was trained on."""
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if self.template == "chat":
            if messages[-1]["role"] == "assistant":
                raise bad_request("the last message is the assistant's: nothing to answer", "messages")
            rendered = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            assert isinstance(rendered, str)
            return rendered
        return build_prompt(Record(self.instruction(messages), "-"), self.template, self.tokenizer)

    def instruction(self, messages: list[dict[str, str]]) -> str:
        """The one instruction an ``alpaca`` or ``plain`` prompt holds: the user message, after the text
        of any system (or developer) messages before it, each its own paragraph."""
        system = [m for m in messages[:-1] if m["role"] in SYSTEM_ROLES]
        if len(system) != len(messages) - 1 or messages[-1]["role"] != "user":
            raise bad_request(
                f"this run's model was trained with the {self.template!r} template, which holds one "
                "instruction: send one user message, after any system messages (or use /v1/completions "
                "with a prompt of your own)",
                "messages",
            )
        return "\n\n".join([*(m["content"] for m in system if m["content"].strip()), messages[-1]["content"]])

    def open(self, body: SamplingRequest, prompt: str, max_tokens: int) -> Opened:
        """The model's text stream for ``prompt`` (on the worker: it tokenizes; decoding starts on the
        first ``next``), or a 400 before anything is sent."""
        prompt_tokens = len(self.tokenizer(prompt)["input_ids"])
        self._check_length(prompt_tokens, max_tokens)
        try:
            stream = self.final.stream(
                prompt,
                max_new_tokens=max_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=secrets.randbits(31) if body.seed is None else body.seed,
                stop=body.stop_strings(),
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return Opened(stream, prompt_tokens, self.tokenizer)

    def _check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        """400 for a prompt and ``max_tokens`` that do not fit the context (naming the prompt when it
        alone does not)."""
        limit = self.max_model_len
        if limit is None or prompt_tokens + max_tokens <= limit:
            return
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
            "completion). Please reduce the length of the prompt or max_tokens.",
            "prompt" if prompt_tokens >= limit else "max_tokens",
        )

    @staticmethod
    async def _whole(
        worker: ModelWorker, opened: Opened, request: Request
    ) -> tuple[str, str, dict[str, int]]:
        text = "".join([delta async for delta in RunService._deltas(worker, opened, request)])
        return text, opened.finish_reason(), opened.usage(text)

    @staticmethod
    async def _deltas(worker: ModelWorker, opened: Opened, request: Request) -> AsyncIterator[str]:
        """Each text delta as it is decoded, one model step per turn on the worker; the decoding ends
        when the client goes away, and (``finally``) when this is cancelled or closed."""
        try:
            while (delta := await worker.run(opened.advance)) is not None:
                if delta:
                    yield delta
                if await request.is_disconnected():
                    return
        finally:
            opened.close()  # a flag: a step running on the worker is the last

    # ----- completions ----------------------------------------------------------------------------
    async def _completion(
        self, worker: ModelWorker, opened: list[Opened], request: Request
    ) -> dict[str, Any]:
        choices, totals = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for index, one in enumerate(opened):
            text, reason, usage = await self._whole(worker, one, request)
            choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": reason})
            totals = {key: totals[key] + usage[key] for key in totals}
        return completion_body(self.name, choices, totals["prompt_tokens"], totals["completion_tokens"])

    async def _completion_chunks(
        self, worker: ModelWorker, opened: Opened, request: Request
    ) -> AsyncIterator[dict[str, Any]]:
        ident, created = new_id("cmpl"), now()

        def chunk(text: str, reason: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": self.name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
            }

        async for delta in self._deltas(worker, opened, request):
            yield chunk(delta, None)
        yield chunk("", opened.finish_reason())

    # ----- chat -----------------------------------------------------------------------------------
    async def _chat(self, worker: ModelWorker, opened: Opened, request: Request) -> dict[str, Any]:
        text, reason, usage = await self._whole(worker, opened, request)
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": now(),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            ],
            "usage": usage,
        }

    async def _chat_chunks(
        self, worker: ModelWorker, opened: Opened, include_usage: bool, request: Request
    ) -> AsyncIterator[dict[str, Any]]:
        ident, created = new_id("chatcmpl"), now()

        def chunk(delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.name,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
            }

        yield chunk({"role": "assistant", "content": ""}, None)
        text = ""
        async for delta in self._deltas(worker, opened, request):
            text += delta
            yield chunk({"content": delta}, None)
        yield chunk({}, opened.finish_reason())
        if include_usage:
            yield {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.name,
                "choices": [],
                "usage": opened.usage(text),
            }


class Opened:
    """A text stream about to be decoded, with what its response reports: the prompt's token count,
    the finish reason and the completion's token count (the stream's, else the text re-tokenized)."""

    def __init__(self, stream: Iterator[str], prompt_tokens: int, tokenizer: Any) -> None:
        self.stream, self.prompt_tokens, self.tokenizer = stream, prompt_tokens, tokenizer
        self.text = ""
        """The text decoded so far (what the request log counts)."""

    def advance(self) -> str | None:
        """One step (on the worker): the text it adds, or None once the text has ended. A ``TextStream``
        takes one model step; another stream (a model without a decoder) gives its next piece."""
        delta = self.stream.step() if isinstance(self.stream, TextStream) else next(self.stream, None)
        if delta:
            self.text += delta
        return delta

    def total_tokens(self) -> int:
        """The prompt's and the text's tokens so far."""
        return self.usage(self.text)["total_tokens"]

    def close(self) -> None:
        """No more steps (a flag, safe from the event loop while a step runs on the worker)."""
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()

    def finish_reason(self) -> str:
        reason = getattr(self.stream, "finish_reason", None)
        return reason if reason in ("stop", "length") else "stop"

    def usage(self, text: str) -> dict[str, int]:
        completion = getattr(self.stream, "new_tokens", None)
        if completion is None:
            completion = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": int(completion),
            "total_tokens": self.prompt_tokens + int(completion),
        }


def run_service(
    run_dir: Path,
    *,
    served_name: str | None = None,
    variant: str | None = None,
    options: dict[str, str] | None = None,
) -> RunService:
    """The final model of the run in ``run_dir`` (its method's ``variant`` and ``options``), to serve."""
    from fedtune.artifacts import load_final

    final = load_final(run_dir, variant, options or {})
    return RunService(final, served_name or run_dir.resolve().name)
