"""The large model behind an HTTP API: a ``LogitSource`` over vLLM's OpenAI-compatible ``/v1/completions``.

A server that returns prompt log-probabilities by token id (vLLM, or ``fedtune serve MODEL``) gives the
large model's next-token distribution without its weights. ``HTTPLogitSource``:

- **connects** by asking ``GET /v1/models`` for the served model and checking that the server's
  tokenizer is the small model's: a probe text must tokenize to the same ids and token strings
  (``POST /tokenize``), and the whole vocabulary, decoded in chunks of ids, must read the same
  (``POST /detokenize``); a mismatch is a ``VocabMismatch`` naming the URL. The source then uses the
  local (small model's) tokenizer, and its width is that tokenizer's length.
- **scores** a teacher-forced batch (``labelled_logits``) with one request per row: the row's tokens as
  ids, ``max_tokens: 0``, ``echo: true``, ``prompt_logprobs: k``. Every position comes back with its top
  ``k`` plus the prompt's own token, so the labelled token's log-probability is always exact.
- **decodes** (``session``): every step re-sends each unfinished row's whole prefix with
  ``max_tokens: 1``, ``logprobs: k``, ``temperature: 0``, ``return_tokens_as_token_ids: true``
  (no server-side cache is assumed; a server with prefix caching answers it from its cache).

**The residual fill.** A position known on a set ``K`` of ids (the top ``k`` and the label) leaves the
mass ``r = 1 - sum_K p`` to the ``U = V - |K|`` ids it did not name. They get ``log(r / U)`` each (spread
uniformly), capped at the smallest of the top ``k`` (an unnamed id cannot be likelier than a named one);
``r = 0`` (to rounding) gives them ``log(1e-12 / U)``. Known ids keep their exact log-probabilities, so the
rows are log-probabilities, exact where ``known`` (``TopK.known``) is set. With ``k`` = the vocabulary
nothing is filled and the rows equal the model's log-softmax. In proxy-tuned decoding the candidates are
therefore the large model's top ``k`` (exact values) and every other token at the residual value plus
the small models' difference: the union of the large model's top ``k`` and the small models' support.

**What an answer must mean.** A server is trusted with nothing its answer can be checked on: every
log-probability must be a finite number <= 0, each position's named ids must be distinct ids of the
vocabulary (``0 <= id < V``) holding a total probability of at most ``1 + MASS_TOLERANCE``, and every
prompt position must name the prompt's own token (so the labelled token's value is exact, never a
fill). An answer that breaks a rule is ``AnswerRejected`` naming the URL, the position, the id and the
value; it is retried like a failed request, and after the last retry ``LargeModelMisbehaved`` stops the
round with the reason. A lying server therefore cannot feed NaN into distillation or fake a likelier
teacher.

Rows are sent concurrently (``concurrency`` threads); a request that fails to connect, times out, or
is answered 408, 429 or 5xx is retried ``retries`` times with exponential backoff (``backoff * 2**i``
seconds), then ``LargeModelUnavailable`` names the URL and what to do. Any other 4xx is
``LargeModelRefused`` with the server's message. ``timeout`` is a total deadline for each attempt
(connect, send, headers and body together): a server that trickles its answer a byte at a time is cut
off when the deadline passes, not kept alive by every byte. ``usage`` counts requests, retries, bytes
each way and the wall-clock seconds callers waited (FedPT reports them per round as ``api_*``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

import httpcore
import httpx
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from fedtune.decode.generate import StepFn
from fedtune.errors import RunError
from fedtune.proxy.api_url import check_api_url
from fedtune.proxy.vocab import VocabMismatch

T = TypeVar("T")

PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. 0123456789 ¿Qué tal? Naïve café, 東京, 🙂.\n"
    "def f(x):\n    return {'a': [1, 2.5]}  # done\n\tEnd"
)
"""What the tokenizer check tokenizes on both sides: letters, digits, accents, CJK, emoji, code, spaces."""
VOCAB_CHUNK = 8192
"""Ids per ``/detokenize`` request of the vocabulary check."""
RESIDUAL_FLOOR = 1e-12
"""The residual mass assumed when the known ids already hold all of it (to rounding)."""
RETRY_STATUS = frozenset({408, 429})
"""4xx statuses worth retrying (a timeout, too many requests); every 5xx is retried too."""
API_KEY_ENV = "FEDTUNE_LARGE_API_KEY"
"""The environment variable holding the bearer token FedPT sends to its large model's server."""
MASS_TOLERANCE = 1e-3
"""How far above 1 a position's named probabilities may sum (the server's rounding), and no further."""
LOGPROB_TOLERANCE = 1e-4
"""How far above 0 a log-probability may be (rounding of a near-certain token); it is read as 0."""


class LargeModelUnavailable(RunError):
    """The large model's server did not answer after every retry."""


class LargeModelRefused(RunError):
    """The large model's server answered a request with an error that retrying cannot fix."""


class LargeModelMisbehaved(RunError):
    """The large model's server kept answering with values no distribution has (module docstring)."""


class AnswerRejected(ValueError):
    """One answer broke a rule of what log-probabilities mean; the message says where and how."""


def checked_position(entries: Mapping[Any, Any], width: int, where: str) -> dict[int, float]:
    """One position's ``{id: logprob}`` after the rules of the module docstring (``where`` names it)."""
    out: dict[int, float] = {}
    for key, value in entries.items():
        try:
            token = _token_id(str(key))
        except ValueError:
            raise AnswerRejected(f"{where}: {key!r} is not a token id") from None
        raw: Any = value.get("logprob") if isinstance(value, Mapping) else value
        try:
            logprob = float(raw)
        except (TypeError, ValueError):
            raise AnswerRejected(f"{where}, id {token}: log-probability {raw!r} is not a number") from None
        if not 0 <= token < width:
            raise AnswerRejected(f"{where}: id {token} is outside the vocabulary (0..{width - 1})")
        if not math.isfinite(logprob) or logprob > LOGPROB_TOLERANCE:
            raise AnswerRejected(
                f"{where}, id {token}: log-probability {logprob!r} (must be finite and <= 0)"
            )
        if token in out:
            raise AnswerRejected(f"{where}: id {token} is named twice")
        out[token] = min(logprob, 0.0)
    mass = math.fsum(math.exp(v) for v in out.values())
    if mass > 1 + MASS_TOLERANCE:
        raise AnswerRejected(f"{where}: the named ids hold probability {mass:.6g}, more than 1")
    return out


def checked_prompt(positions: Sequence[Any], tokens: Sequence[int], width: int) -> list[dict[int, float]]:
    """A prompt's per-position entries, checked, each naming the prompt's own token (position 0: none)."""
    rows: list[dict[int, float]] = [{}]
    for position in range(1, len(tokens)):
        entries = positions[position]
        where = f"prompt position {position}"
        if not isinstance(entries, Mapping):
            raise AnswerRejected(f"{where}: no log-probabilities ({entries!r})")
        row = checked_position(entries, width, where)
        if tokens[position] not in row:
            raise AnswerRejected(
                f"{where}: the prompt's own token {tokens[position]} is missing, so its log-probability "
                "would be a guess"
            )
        rows.append(row)
    return rows


_deadline = threading.local()
"""The monotonic time by which this thread's current request must be done (``_deadline.at``)."""


def _remaining(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the current request's deadline; ReadTimeout once it passed."""
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every read and write ends by the request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _remaining(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _remaining(timeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _DeadlineStream(self.inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = super().connect_tcp(host, port, _remaining(timeout), local_address, socket_options)
        return _DeadlineStream(stream)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over a connection pool whose sockets honour a per-request deadline: httpx's own
    timeouts bound each socket operation, so a server sending a byte just before each one ran forever."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(network_backend=_DeadlineBackend())


@dataclass
class APIUsage:
    """What talking to the API cost: requests answered, retries, bytes sent and received, and the
    wall-clock seconds callers waited on it."""

    requests: int = 0
    retries: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0

    def __sub__(self, other: APIUsage) -> APIUsage:
        return APIUsage(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def metrics(self, prefix: str = "api_") -> dict[str, float]:
        return {f"{prefix}{f.name}": getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class HTTPSettings:
    """How ``HTTPLogitSource`` talks to its server (``fedpt.top_k`` and ``fedpt.api_*``)."""

    top_k: int = 20
    timeout: float = 60.0
    retries: int = 4
    backoff: float = 0.5
    concurrency: int = 4


@dataclass
class TopK:
    """Filled log-probabilities ``[N, V]`` and which entries the server named (``known``)."""

    logprobs: Tensor
    known: Tensor


def fill_residual(rows: Sequence[Mapping[int, float]], width: int, top_k: int) -> TopK:
    """``[N, width]`` log-probabilities from each row's known ``{id: logprob}``, the rest filled from the
    residual mass (module docstring). Ids at or past ``width`` count in the mass but are not returned."""
    values = torch.empty((len(rows), width), dtype=torch.float32)
    known = torch.zeros((len(rows), width), dtype=torch.bool)
    for index, entries in enumerate(rows):
        ids = [i for i in entries if 0 <= i < width]
        unseen = width - len(ids)
        if unseen:
            ranked = sorted(entries.values(), reverse=True)[:top_k]
            mass = math.fsum(math.exp(v) for v in entries.values())
            residual = 1.0 - mass
            fill = math.log((residual if residual > RESIDUAL_FLOOR else RESIDUAL_FLOOR) / unseen)
            values[index] = min(fill, ranked[-1]) if ranked else math.log(1.0 / width)
        if ids:
            columns = torch.tensor(ids, dtype=torch.long)
            values[index, columns] = torch.tensor([entries[i] for i in ids], dtype=torch.float32)
            known[index, columns] = True
    return TopK(values, known)


def _token_id(key: str) -> int:
    return int(key[len("token_id:") :] if key.startswith("token_id:") else key)


class HTTPLogitSource:
    """A large model's next-token log-probabilities from an OpenAI-compatible server (module docstring).

    ``url`` is the API base (``http://host:port/v1``); ``/tokenize`` and ``/detokenize`` are looked for
    at its root, as vLLM serves them. ``tokenizer`` is the small model's: the server must use the same
    (``connect`` checks it). ``model``: the served model's name (default: the server's first).
    """

    def __init__(
        self,
        url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model: str | None = None,
        settings: HTTPSettings | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        try:
            self.url = check_api_url(url)
        except ValueError as exc:
            raise ValueError(f"{url!r}: {exc}") from None
        self.root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        self.model = model
        self.settings = settings or HTTPSettings()
        self._tokenizer = tokenizer
        self.max_model_len: int | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.settings.timeout),
            transport=transport if transport is not None else _DeadlineTransport(),
        )
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.usage = APIUsage()
        self.name = f"{model or 'the model'} at {self.url}"

    @classmethod
    def connect(
        cls,
        url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model: str | None = None,
        settings: HTTPSettings | None = None,
        api_key: str | None = None,
    ) -> HTTPLogitSource:
        """A source whose server answered and whose tokenizer is ``tokenizer`` (else a clear error)."""
        source = cls(url, tokenizer, model=model, settings=settings, api_key=api_key)
        source.check()
        return source

    # ----- the LogitSource protocol ---------------------------------------------------------------

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def vocab_width(self) -> int:
        return len(self._tokenizer)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def eos_token_ids(self) -> list[int]:
        eos = self._tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer defines no EOS token")
        return [int(eos)]

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """``[N, V]`` log-probabilities at the positions predicting a labelled token (row-major, as
        ``train.losses.labelled_logits``), filled beyond the top ``k`` (module docstring)."""
        return self.labelled_logprobs(batch).logprobs

    def labelled_logprobs(self, batch: Mapping[str, Tensor]) -> TopK:
        """``labelled_logits`` with the mask of the entries the server named."""
        ids, mask, labels = (batch[key].detach().cpu() for key in ("input_ids", "attention_mask", "labels"))
        jobs: list[tuple[list[int], list[int]]] = []
        for row in range(ids.shape[0]):
            real = mask[row].nonzero().flatten().tolist()
            where = {position: index for index, position in enumerate(real)}
            wanted = (labels[row, 1:] != -100).nonzero().flatten().tolist()
            # Position t predicts token t + 1: the server's entry for prompt position t + 1.
            jobs.append((ids[row, real].tolist(), [where[t + 1] for t in wanted]))
        replies = self._timed(lambda: self._map(self._prompt_logprobs, [tokens for tokens, _ in jobs]))
        rows = [reply[j] for reply, (_, positions) in zip(replies, jobs, strict=True) for j in positions]
        return fill_residual(rows, self.vocab_width, self._k())

    def session(self) -> StepFn:
        """A decoding session: each step re-sends every unfinished row's prefix (no server-side state)."""
        prefixes: list[list[int]] = []
        finished: list[bool] = []
        eos = set(self.eos_token_ids())

        def step(new_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
            tokens, mask = new_ids.detach().cpu(), attention_mask[:, -new_ids.shape[1] :].detach().cpu()
            first = not prefixes
            for row in range(tokens.shape[0]):
                new = tokens[row][mask[row] == 1].tolist()
                if first:
                    prefixes.append(new)
                    finished.append(False)
                else:
                    finished[row] = finished[row] or any(t in eos for t in new)
                    prefixes[row].extend(new)
            open_rows = [row for row in range(len(prefixes)) if not finished[row]]
            replies = self._timed(lambda: self._map(self._next_logprobs, [prefixes[r] for r in open_rows]))
            answers = dict(zip(open_rows, replies, strict=True))
            rows = [answers.get(row, {}) for row in range(len(prefixes))]
            return fill_residual(rows, self.vocab_width, self._k()).logprobs

        return step

    # ----- connecting -----------------------------------------------------------------------------
    def check(self) -> None:
        """The served model exists and its tokenizer is ours; a clear error naming the URL otherwise."""
        served = self._get("/models").get("data") or []
        names = [str(card.get("id")) for card in served]
        if not names:
            raise LargeModelRefused(f"the server at {self.url} lists no model (GET {self.url}/models)")
        if self.model is None:
            self.model = names[0]
            self.name = f"{self.model} at {self.url}"
        elif self.model not in names:
            raise LargeModelRefused(
                f"the server at {self.url} serves {', '.join(map(repr, names))}, not {self.model!r}: set "
                "fedpt.large_model_name to one of those"
            )
        card = served[names.index(self.model)]
        self.max_model_len = card.get("max_model_len")
        self._check_tokenizer()

    def _check_tokenizer(self) -> None:
        tok = self._tokenizer
        local = tok(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        remote = self._post(
            f"{self.root}/tokenize",
            {
                "model": self.model,
                "prompt": PROBE_TEXT,
                "add_special_tokens": False,
                "return_token_strs": True,
            },
        )
        if list(remote.get("tokens") or []) != list(local):
            raise self._mismatch(f"a probe text tokenizes to {len(remote.get('tokens') or [])} other ids")
        strs = remote.get("token_strs")
        if strs is not None and list(strs) != tok.convert_ids_to_tokens(local):
            raise self._mismatch("a probe text's tokens have other strings")
        width = self.vocab_width
        for start in range(0, width, VOCAB_CHUNK):
            ids = list(range(start, min(width, start + VOCAB_CHUNK)))
            text = self._post(f"{self.root}/detokenize", {"model": self.model, "tokens": ids}).get("prompt")
            expected = tok.decode(ids)
            if text != expected:
                at = next(
                    (i for i, (a, b) in enumerate(zip(text or "", expected, strict=False)) if a != b), None
                )
                where = f"first difference at character {at}" if at is not None else "different lengths"
                raise self._mismatch(f"token ids {ids[0]}..{ids[-1]} decode to other text ({where})")

    def _mismatch(self, what: str) -> VocabMismatch:
        return VocabMismatch(
            f"the large model at {self.url} ({self.model}) does not use the small model's tokenizer: {what}. "
            "Proxy-tuning adds logits id by id, so the served model must share the small model's "
            "vocabulary (e.g. serve the model the small one was derived from)"
        )

    # ----- requests -------------------------------------------------------------------------------
    def _k(self) -> int:
        return max(1, min(self.settings.top_k, self.vocab_width))

    def _prompt_logprobs(self, tokens: list[int]) -> list[dict[int, float]]:
        """Each prompt position's known ``{id: logprob}`` (position 0: empty), checked."""
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": 0,
            "echo": True,
            "prompt_logprobs": self._k(),
            "return_tokens_as_token_ids": True,
        }

        def read(reply: Mapping[str, Any]) -> list[dict[int, float]]:
            positions = self._choice(reply).get("prompt_logprobs")
            if not isinstance(positions, list) or len(positions) != len(tokens):
                got = len(positions) if isinstance(positions, list) else "no"
                raise LargeModelRefused(
                    f"the server at {self.url} returned {got} prompt log-probabilities for a prompt of "
                    f"{len(tokens)} tokens: it must support vLLM's prompt_logprobs (with vLLM, also turn "
                    "off prefix caching: --no-enable-prefix-caching)"
                )
            return checked_prompt(positions, tokens, self.vocab_width)

        return self._post(f"{self.url}/completions", body, read)

    def _next_logprobs(self, tokens: list[int]) -> dict[int, float]:
        """The known ``{id: logprob}`` of the token after ``tokens``, checked."""
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": 1,
            "logprobs": self._k(),
            "temperature": 0.0,
            "return_tokens_as_token_ids": True,
        }

        def read(reply: Mapping[str, Any]) -> dict[int, float]:
            logprobs = self._choice(reply).get("logprobs") or {}
            top = (logprobs.get("top_logprobs") or [None])[0]
            if not isinstance(top, Mapping) or not top:
                raise LargeModelRefused(
                    f"the server at {self.url} returned no top log-probabilities (logprobs)"
                )
            if not all(str(key).removeprefix("token_id:").lstrip("-").isdigit() for key in top):
                raise LargeModelRefused(
                    f"the server at {self.url} names tokens by text, not id: it must honour "
                    "return_tokens_as_token_ids (vLLM does)"
                )
            return checked_position(top, self.vocab_width, f"the next token after {len(tokens)} tokens")

        return self._post(f"{self.url}/completions", body, read)

    def _choice(self, reply: Mapping[str, Any]) -> Mapping[str, Any]:
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices:
            raise LargeModelRefused(f"the server at {self.url} answered without choices")
        choice: Mapping[str, Any] = choices[0]
        return choice

    def _get(self, path: str) -> dict[str, Any]:
        return self._request("GET", f"{self.url}{path}", None, _as_is)

    def _post(
        self, url: str, payload: Mapping[str, Any], read: Callable[[dict[str, Any]], T] | None = None
    ) -> Any:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return self._request("POST", url, body, read if read is not None else _as_is)

    def _request(self, method: str, url: str, body: bytes | None, read: Callable[[dict[str, Any]], T]) -> T:
        """One request, retried with backoff on connection failures, timeouts, 408/429, 5xx and answers
        ``read`` rejects (``AnswerRejected``); ``read``'s value of the first good answer."""
        settings = self.settings
        started = time.monotonic()
        problem = ""
        rejected = False
        for attempt in range(settings.retries + 1):
            if attempt:
                with self._lock:
                    self.usage.retries += 1
                time.sleep(settings.backoff * 2 ** (attempt - 1))
            try:
                response = self._send(method, url, body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            with self._lock:
                self.usage.requests += 1
                self.usage.bytes_up += len(body or b"")
                self.usage.bytes_down += len(response.content)
            if response.status_code < 400:
                try:
                    return read(self._json(method, url, response))
                except AnswerRejected as exc:
                    problem, rejected = str(exc), True
                    continue
            problem = f"HTTP {response.status_code}: {self._error_message(response)}"
            rejected = False
            if response.status_code in RETRY_STATUS or response.status_code >= 500:
                continue
            raise LargeModelRefused(self._refusal(method, url, response.status_code, problem))
        if rejected:
            raise LargeModelMisbehaved(
                f"the large model at {self.url} answered {method} {url} with values that are not "
                f"log-probabilities in each of {settings.retries + 1} attempts (last: {problem}); nothing "
                "from it was used. Check the server (or what stands between it and this run), then "
                "`fedtune resume RUN_DIR`"
            )
        raise LargeModelUnavailable(
            f"the large model at {self.url} did not answer {method} {url} after {settings.retries + 1} "
            f"attempts over {time.monotonic() - started:.1f} s (last: {problem}). Is its server running? "
            "Start it (`fedtune serve MODEL`, or vLLM's OpenAI server) and continue with `fedtune resume "
            "RUN_DIR`; fedpt.api_retries and fedpt.api_backoff set how long to wait"
        )

    def _send(self, method: str, url: str, body: bytes | None) -> httpx.Response:
        """The response, read whole within ``settings.timeout`` from the start (a total deadline)."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        _deadline.at = time.monotonic() + self.settings.timeout
        try:
            return self._client.request(method, url, content=body, headers=headers)
        finally:
            _deadline.at = None

    @staticmethod
    def _json(method: str, url: str, response: httpx.Response) -> dict[str, Any]:
        try:
            answer = response.json()
        except ValueError:
            raise LargeModelRefused(f"{method} {url} answered with something that is not JSON") from None
        if not isinstance(answer, dict):
            raise AnswerRejected(
                f"{method} {url} answered with a JSON {type(answer).__name__}, not an object"
            )
        return answer

    @staticmethod
    def _error_message(response: httpx.Response) -> str:
        try:
            body = response.json()
        except ValueError:
            return response.text[:300]
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message") if isinstance(error, dict) else None
        return str(message or body)[:500]

    def _refusal(self, method: str, url: str, status: int, problem: str) -> str:
        hint = ""
        if status == 401:
            hint = f"; set {API_KEY_ENV} to the server's API key"
        elif "max allowed" in problem or "logprobs" in problem:
            hint = (
                f"; lower fedpt.top_k (now {self.settings.top_k}) or start the server with a larger "
                "--max-logprobs"
            )
        elif status == 404 and "model" in problem:
            hint = "; set fedpt.large_model_name to a model the server lists"
        return f"the large model at {self.url} refused {method} {url}: {problem}{hint}"

    # ----- concurrency and accounting -------------------------------------------------------------
    def _map(self, fn: Callable[[list[int]], T], items: list[list[int]]) -> list[T]:
        if len(items) <= 1 or self.settings.concurrency <= 1:
            return [fn(item) for item in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="fedtune-api")
        return list(self._pool.map(fn, items))

    def _timed(self, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            with self._lock:
                self.usage.seconds += time.perf_counter() - started

    def close(self) -> None:
        self._client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _as_is(answer: dict[str, Any]) -> dict[str, Any]:
    return answer


def api_usage(source: object) -> APIUsage | None:
    """A copy of ``source``'s API usage, or None for a source that does not talk to an API."""
    usage = getattr(source, "usage", None)
    return replace(usage) if isinstance(usage, APIUsage) else None
