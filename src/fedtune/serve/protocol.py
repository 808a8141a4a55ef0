"""The requests ``fedtune serve`` accepts and the OpenAI error shape it answers with.

The request models follow the OpenAI API and vLLM's extensions to it (``prompt_logprobs``,
``return_tokens_as_token_ids``, ``/tokenize``, ``/detokenize``). Fields a client may send that the
server does not act on (``user``, ``presence_penalty``, ...) are accepted and ignored, as OpenAI-compatible
servers do; a field that changes what would be computed and is not supported is refused by name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

BaseModelT = TypeVar("BaseModelT", bound=BaseModel)


class APIError(Exception):
    """A request the server refuses: the HTTP status and the OpenAI error body's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, what OpenAI's clients parse."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def validation_error(problems: Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 naming the first offending field (dotted path) and every problem found (pydantic's
    ``errors()``): OpenAI and vLLM answer a body that does not fit the schema 400
    ``invalid_request_error``, not FastAPI's 422."""
    location = problems[0].get("loc", ()) if problems else ()
    param = str(location[0]) if location else None  # the request's own field, not pydantic's union branch
    details = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg', 'invalid')}" for e in problems
    )
    return APIError(400, f"invalid request: {details}", param=param)


def parse(model: type[BaseModelT], body: Any) -> BaseModelT:
    """``body`` (parsed JSON) as ``model``; 400 with the field's name when it does not fit."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


class Request(BaseModel):
    """Base of every request: unknown fields are accepted and ignored (clients send many)."""

    model_config = ConfigDict(extra="ignore")


StopParam = str | list[str] | None

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""The seeds accepted: a signed 64-bit integer, as OpenAI's API and vLLM take (torch's generator takes
no wider one)."""


class SamplingRequest(Request):
    """What both completion endpoints share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: StopParam = None
    stream: bool = False
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: StopParam) -> StopParam:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


TokenIds = list[int]
PromptParam = str | list[str] | TokenIds | list[TokenIds]


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions`` (OpenAI's legacy completions plus vLLM's logprob extensions)."""

    prompt: PromptParam
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool = False
    add_special_tokens: bool = True
    suffix: str | None = None

    def prompts(self) -> list[str | TokenIds]:
        """The prompt as a list of prompts, each a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; only text parts are supported."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"only text content parts are supported, got {part.get('type')!r}", "messages"
                )
            texts.append(part["text"])
        return "".join(texts)


class ChatRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stream_options: dict[str, Any] | None = None


class TokenizeRequest(Request):
    """vLLM's ``POST /tokenize`` (text prompts)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(Request):
    """vLLM's ``POST /detokenize``."""

    model: str | None = None
    tokens: list[int]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def completion_body(
    model: str, choices: list[dict[str, Any]], prompt: int, completion: int
) -> dict[str, Any]:
    """A whole (not streamed) ``/v1/completions`` response: its choices and token usage."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
