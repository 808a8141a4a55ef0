"""What a large model's HTTP answer must mean before FedPT uses it: finite log-probabilities <= 0, ids of
the vocabulary, at most probability 1 per position, the prompt's own token named; a lying answer is
retried, then refused with the URL, the position and the value. And a request's timeout is a deadline."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import torch

from fedtune.proxy.http_source import (
    HTTPLogitSource,
    HTTPSettings,
    LargeModelMisbehaved,
    LargeModelUnavailable,
)

URL = "http://127.0.0.1:9/v1"
WIDTH = 10
TOKENS = [3, 1, 4, 1, 5]


class Tokenizer:
    """What the source reads of a tokenizer when it scores (its width and EOS)."""

    eos_token_id = 0

    def __len__(self) -> int:
        return WIDTH


def honest(tokens: list[int]) -> list[Any]:
    """vLLM's prompt_logprobs for ``tokens``: each position the uniform top-2 plus the prompt's token."""
    positions: list[Any] = [None]
    for token in tokens[1:]:
        named = {token, 7, 8}
        positions.append({f"token_id:{i}": {"logprob": math.log(0.1), "rank": 1} for i in named})
    return positions


def serving(rewrite: Callable[[list[Any]], list[Any]], calls: list[int]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        body = json.loads(request.content)
        positions = rewrite(honest(body["prompt"]))
        # json.dumps writes NaN and Infinity as a lying server could
        return httpx.Response(200, content=json.dumps({"choices": [{"prompt_logprobs": positions}]}))

    return httpx.MockTransport(handle)


def source(transport: httpx.BaseTransport, retries: int = 2) -> HTTPLogitSource:
    settings = HTTPSettings(top_k=2, retries=retries, backoff=0.0, concurrency=1)
    return HTTPLogitSource(URL, Tokenizer(), model="m", settings=settings, transport=transport)  # type: ignore[arg-type]


def batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([TOKENS])
    labels = ids.clone()
    labels[0, :2] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def set_value(position: int, token: int, value: Any) -> Callable[[list[Any]], list[Any]]:
    def rewrite(positions: list[Any]) -> list[Any]:
        positions[position][f"token_id:{token}"] = {"logprob": value}
        return positions

    return rewrite


def test_an_honest_answer_is_used_and_its_labelled_tokens_are_exact() -> None:
    calls: list[int] = []
    top = source(serving(lambda p: p, calls)).labelled_logprobs(batch())
    assert len(calls) == 1
    assert top.logprobs.shape == (3, WIDTH) and bool(torch.isfinite(top.logprobs).all())
    for row, token in enumerate(TOKENS[2:]):
        assert bool(top.known[row, token]) and top.logprobs[row, token].item() == pytest.approx(math.log(0.1))


@pytest.mark.parametrize(
    ("rewrite", "what"),
    [
        (set_value(2, 4, float("nan")), r"prompt position 2, id 4: log-probability nan"),
        (set_value(2, 4, float("inf")), r"log-probability inf \(must be finite and <= 0\)"),
        (set_value(3, 1, float("-inf")), r"prompt position 3, id 1: log-probability -inf"),
        (set_value(2, 4, 5.0), r"prompt position 2, id 4: log-probability 5\.0"),
        (set_value(2, 4, "abc"), r"prompt position 2, id 4: log-probability 'abc' is not a number"),
        (set_value(2, 99, -1.0), r"id 99 is outside the vocabulary \(0\.\.9\)"),
        (set_value(2, -3, -1.0), r"id -3 is outside the vocabulary"),
        (set_value(2, 7, math.log(0.95)), r"prompt position 2: the named ids hold probability 1\.15"),
    ],
)
def test_a_lying_answer_is_retried_then_refused_with_the_url_position_and_value(
    rewrite: Callable[[list[Any]], list[Any]], what: str
) -> None:
    calls: list[int] = []
    lying = source(serving(rewrite, calls), retries=2)
    with pytest.raises(LargeModelMisbehaved, match=rf"127\.0\.0\.1:9/v1.*3 attempts.*{what}"):
        lying.labelled_logprobs(batch())
    assert len(calls) == 3  # the first try and two retries


def test_a_prompt_token_missing_from_the_answer_is_refused_not_filled() -> None:
    def drop_own_token(positions: list[Any]) -> list[Any]:
        del positions[2]["token_id:4"]
        return positions

    with pytest.raises(LargeModelMisbehaved, match=r"prompt position 2: the prompt's own token 4 is missing"):
        source(serving(drop_own_token, [])).labelled_logprobs(batch())


def test_a_server_that_lies_once_is_used_after_the_retry() -> None:
    calls: list[int] = []
    nan_first = set_value(2, 4, float("nan"))
    top = source(serving(lambda p: nan_first(p) if len(calls) == 1 else p, calls)).labelled_logprobs(batch())
    assert len(calls) == 2 and bool(torch.isfinite(top.logprobs).all())


@pytest.fixture
def trickling() -> Iterator[str]:
    """A loopback server that answers every connection with headers, then one body byte every 0.3 s,
    for at most 20 s (it stops by itself)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            end = time.monotonic() + 20
            while not stop.is_set() and time.monotonic() < end:
                try:
                    conn.sendall(b" ")
                except OSError:
                    return
                time.sleep(0.3)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    thread.join()
    listener.close()


def test_the_timeout_is_a_deadline_for_the_whole_answer(trickling: str) -> None:
    # A byte every 0.3 s keeps a per-read timeout of 1 s alive forever; the deadline ends each attempt
    # after 1 s: three attempts well inside 10 s.
    settings = HTTPSettings(top_k=2, timeout=1.0, retries=2, backoff=0.0, concurrency=1)
    slow = HTTPLogitSource(trickling, Tokenizer(), model="m", settings=settings)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(LargeModelUnavailable, match=r"after 3 attempts.*ReadTimeout"):
        slow.labelled_logprobs(batch())
    assert time.monotonic() - started < 10
