"""The HTTP application ``fedtune serve`` runs: a service's routes, OpenAI-shaped errors, a bearer token.

A service (``logits.LogitsService`` for a model, ``run.RunService`` for a finished run) answers requests
on one model worker thread: requests are received concurrently, the model computes one step at a time
(a decoding request takes one step per turn, so requests in flight take turns). At most
``max_concurrent`` requests are in flight; one more is answered 429 at once rather than queued.
Every error leaves as ``{"error": {"message", "type", "param", "code"}}`` with its status (400 a request
the server cannot serve or a body that does not fit the schema, naming the field in ``param``, as OpenAI
and vLLM answer; 401 a missing or wrong API key, 404 an unknown model or route, 500 a failure, logged on
the server); a traceback never leaves the process. Every request is logged in one line when its response
ends (``RequestLog``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fedtune.serve.protocol import APIError, bad_request, error_body, now, validation_error

log = logging.getLogger("fedtune.serve")

T = TypeVar("T")

OPEN_PATHS = frozenset({"/health"})
"""Paths answered without the API key (a load balancer's health check)."""
DEFAULT_MAX_CONCURRENT = 64
"""Requests in flight at once (``--max-concurrent``) before more are answered 429."""


class Slot:
    """A request's place among those in flight; ``release`` gives it back (once, however often called)."""

    def __init__(self, worker: ModelWorker) -> None:
        self._worker: ModelWorker | None = worker

    def release(self) -> None:
        if self._worker is not None:
            self._worker.in_flight -= 1
            self._worker = None

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelWorker:
    """One thread that runs every model call, in the order they come, for at most ``max_concurrent``
    requests in flight (``slot``)."""

    def __init__(self, max_concurrent: int = DEFAULT_MAX_CONCURRENT) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedtune-serve-model")
        self.max_concurrent, self.in_flight = max_concurrent, 0

    def slot(self) -> Slot:
        """A place for one more request (on the event loop's thread), or a 429 when all are taken."""
        if self.in_flight >= self.max_concurrent:
            raise APIError(
                429,
                f"the server is busy: {self.max_concurrent} requests are in flight (its --max-concurrent); "
                "retry later",
                type="rate_limit_error",
                code="server_busy",
            )
        self.in_flight += 1
        return Slot(self)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Service(Protocol):
    """What the application serves: one model under ``name``."""

    name: str
    max_model_len: int | None

    def mount(self, app: FastAPI, worker: ModelWorker) -> None:
        """Add the service's routes to ``app``; model work goes through ``worker``."""
        ...


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` as compact JSON, without FastAPI's slow per-value encoder (prompt logprobs are large)."""
    return Response(
        json.dumps(content, separators=(",", ":")), status_code=status, media_type="application/json"
    )


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None


def check_model(requested: str | None, served: str) -> None:
    """404 for a request naming another model (leaving ``model`` out means the served one)."""
    if requested is not None and requested != served:
        raise APIError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served}` (GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def sse(
    chunks: Iterator[dict[str, Any]] | AsyncIterator[dict[str, Any]], slot: Slot | None = None
) -> StreamingResponse:
    """Server-sent events: ``data: {json}`` per chunk, then ``data: [DONE]``; an error after the first
    chunk (the status is already sent) is sent as a last ``data: {"error": ...}`` event. ``slot`` is
    released when the stream ends, however it ends."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in _events(chunks):
                yield event
        finally:  # also when the client went away or the server stops: end the decoding now
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            if slot is not None:
                slot.release()

    background = None if slot is None else BackgroundTask(slot.release)  # also when never iterated
    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}, background=background
    )


async def _events(chunks: Iterator[dict[str, Any]] | AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        if hasattr(chunks, "__aiter__"):
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
        else:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
    except APIError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n".encode()
        return
    except Exception:
        log.exception("streaming a response failed")
        body = error_body(
            "the server failed while streaming this response (logged on the server)", "server_error"
        )
        yield f"data: {json.dumps(body)}\n\n".encode()
        return
    yield b"data: [DONE]\n\n"


class RequestLog:
    """ASGI middleware: one INFO line per HTTP request when its response ends (a stream: after its last
    event), ``POST /v1/chat/completions 200 tokens=57 812 ms``: method, path, status, the tokens a route
    reported in ``request.state.tokens`` (a number, or a callable read at the end; ``-`` when none) and
    the milliseconds from receipt to the last byte. A response cut short (the client went away) is
    logged when it ends, with the status it had sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, logged = time.perf_counter(), 500, False

        async def observed(message: Message) -> None:
            nonlocal status, logged
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                logged = True
                log_request(scope, status, start)

        try:
            await self.app(scope, receive, observed)
        finally:
            if not logged:
                log_request(scope, status, start)


def log_request(scope: Scope, status: int, start: float) -> None:
    tokens = scope.get("state", {}).get("tokens")
    if callable(tokens):
        try:
            tokens = tokens()
        except Exception:  # a count is not worth failing a finished request over
            log.debug("counting the tokens of %s failed", scope["path"], exc_info=True)
            tokens = None
    elapsed_ms = (time.perf_counter() - start) * 1000
    shown = "-" if tokens is None else str(tokens)
    log.info("%s %s %d tokens=%s %.0f ms", scope["method"], scope["path"], status, shown, elapsed_ms)


def build_app(
    service: Service, *, api_key: str | None = None, max_concurrent: int = DEFAULT_MAX_CONCURRENT
) -> FastAPI:
    """The FastAPI application serving ``service``; with ``api_key`` every route but ``/health`` needs
    ``Authorization: Bearer <api_key>``; more than ``max_concurrent`` requests in flight are answered 429."""
    worker = ModelWorker(max_concurrent)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        worker.close()

    app = FastAPI(
        title=f"fedtune serve: {service.name}",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.worker = worker

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in exc.errors()]  # less "body"
        return error_response(validation_error(problems))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
            kind = "not_found_error"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            kind = "invalid_request_error"
        else:
            message, kind = str(exc.detail), "invalid_request_error"
        return JSONResponse(error_body(message, kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        body = error_body("the server failed to answer this request (logged on the server)", "server_error")
        return JSONResponse(body, status_code=500)

    if api_key:
        expected = api_key.encode()

        @app.middleware("http")
        async def authenticate(request: Request, call_next: Any) -> Any:
            if request.url.path not in OPEN_PATHS:
                scheme, _, token = request.headers.get("authorization", "").partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
                    return JSONResponse(
                        error_body(
                            "missing or wrong API key: send `Authorization: Bearer <key>`",
                            "authentication_error",
                            code="invalid_api_key",
                        ),
                        status_code=401,
                    )
            return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})  # what vLLM answers

    def card() -> dict[str, Any]:
        return {
            "id": service.name,
            "object": "model",
            "created": now(),
            "owned_by": "fedtune",
            "root": service.name,
            "parent": None,
            "max_model_len": service.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        check_model(model_id, service.name)
        return json_response(card())

    service.mount(app, worker)
    app.add_middleware(RequestLog)  # added last: outermost, so it also logs what the key check refuses
    return app
