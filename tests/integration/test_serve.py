"""`fedtune serve RUN_DIR` through the official `openai` client: a FedIT run (LoRA merged) and a FedPT
run (proxy-tuned decoding), completions, chat, streaming, errors, the bearer token and the host rule;
the bounds that keep one request from wedging the server (context, queue, disconnects, shutdown) on a
deliberately slow model; the CLI's checks of --host and --port."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from bench.serve_load import fire
from typer.testing import CliRunner

from fedtune.algorithms.final import Decoder, FinalModel, FinalModelError
from fedtune.artifacts import generate_from_run, load_final, run_config
from fedtune.cli import app as cli
from fedtune.serve import BackgroundServer, RunService, build_app, run_service
from tests.integration.helpers import quiet_runner, tiny_config

KEY = "test-key"
PROMPT = "Give a synonym of 'happy'."
RUNS = {
    # FedIT with the Alpaca template (one instruction per prompt); FedPT with the chat template.
    "fedit": ("fed.rounds=1", "eval.before=false"),
    "fedpt": ("fed.rounds=1", "eval.before=false", "data.template=chat", "fedpt.alpha_search=never"),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """A finished tiny run of each method, served with an API key: (run directory, API base URL)."""
    method = request.param
    run_dir = tmp_path_factory.mktemp(method) / "run"
    quiet_runner(tiny_config(method, *RUNS[method]), run_dir).run()
    with BackgroundServer(build_app(run_service(run_dir, served_name=method), api_key=KEY)) as server:
        yield run_dir, server.url


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def _name(run_dir: Path) -> str:
    return run_config(run_dir).algorithm


def test_completions_and_chat_are_the_runs_final_model(served: tuple[Path, str]) -> None:
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    assert [m.id for m in client.models.list()] == [name]
    # /v1/completions sends the prompt as is; chat applies the run's template, as `fedtune generate` does.
    (raw,) = generate_from_run(run_dir, [PROMPT], max_new_tokens=6, raw=True)
    (templated,) = generate_from_run(run_dir, [PROMPT], max_new_tokens=6)
    completion = client.completions.create(model=name, prompt=PROMPT, max_tokens=6, temperature=0)
    assert completion.choices[0].text == raw
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens >= 1
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": PROMPT}], max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == templated
    # Sampled with a seed (varied text, unlike a tiny random model's greedy one): `fedtune generate`'s.
    (expected,) = generate_from_run(run_dir, [PROMPT], max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    assert len(set(expected)) >= 3
    sampled = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        temperature=1.0,
        top_p=0.9,
        seed=3,
    )
    assert sampled.choices[0].message.content == expected


def test_streaming_sends_the_same_text_in_pieces(served: tuple[Path, str]) -> None:
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    messages = [{"role": "user", "content": PROMPT}]
    sampling: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 11}  # varied, reproducible
    whole = client.chat.completions.create(model=name, messages=messages, **sampling)
    chunks = list(
        client.chat.completions.create(
            model=name, messages=messages, stream=True, stream_options={"include_usage": True}, **sampling
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage, expected_usage = chunks[-1].usage, whole.usage
    assert usage is not None and expected_usage is not None
    assert usage.completion_tokens == expected_usage.completion_tokens
    pieces = list(client.completions.create(model=name, prompt=PROMPT, stream=True, **sampling))
    plain = client.completions.create(model=name, prompt=PROMPT, **sampling).choices[0].text
    assert "".join(p.choices[0].text for p in pieces) == plain and len(set(plain)) >= 3
    # A stop string ends the text before it, streamed or not.
    stop = plain[2:4]
    cut = client.completions.create(model=name, prompt=PROMPT, stop=[stop], **sampling).choices[0]
    assert cut.text == plain[: plain.find(stop)] and cut.finish_reason == "stop"
    streamed = client.completions.create(model=name, prompt=PROMPT, stop=[stop], stream=True, **sampling)
    assert "".join(p.choices[0].text for p in streamed) == cut.text


def test_bad_requests_get_the_openai_error_shape(served: tuple[Path, str]) -> None:
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="other-model", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="n > 1"):
        client.completions.create(model=name, prompt=PROMPT, max_tokens=2, n=2)
    with pytest.raises(openai.BadRequestError) as invalid:  # a schema error is a 400, as OpenAI's
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], temperature=7)
    assert invalid.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        _client(url, key="wrong").models.list()
    conversation = [
        {"role": "user", "content": "Define 'cat'."},
        {"role": "assistant", "content": "An animal."},
        {"role": "user", "content": PROMPT},
    ]
    if run_config(run_dir).data.template == "chat":  # the whole conversation through the chat template
        reply = client.chat.completions.create(model=name, messages=conversation, max_tokens=3, temperature=0)
        assert reply.choices[0].message.content is not None
    else:
        with pytest.raises(openai.BadRequestError, match="send one user message"):
            client.chat.completions.create(model=name, messages=conversation, max_tokens=3)
    # The raw wire: the error body, no traceback, for an unknown route, bad JSON and a missing key.
    headers = {"Authorization": f"Bearer {KEY}"}
    root = url[: -len("/v1")]
    for response, status in [
        (httpx.post(f"{url}/embeddings", json={}, headers=headers), 404),
        (httpx.post(f"{url}/completions", content=b"{not json", headers=headers), 400),
        (httpx.post(f"{url}/completions", json={"prompt": PROMPT}), 401),
    ]:
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    health = httpx.get(f"{root}/health")  # open without the key
    assert health.status_code == 200 and health.json() == {"status": "ok"}  # as vLLM answers


def test_a_system_message_is_folded_into_the_instruction(served: tuple[Path, str]) -> None:
    # Prepare: what a chat client sends (a system message first)
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    system = "You are a careful lexicographer."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": PROMPT}]

    # Execute
    reply = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0)

    # Assert: Alpaca: the system text is the instruction's first paragraph; chat: the chat template's
    if run_config(run_dir).data.template == "chat":
        assert reply.choices[0].message.content is not None
        return
    (expected,) = generate_from_run(run_dir, [f"{system}\n\n{PROMPT}"], max_new_tokens=6)
    assert reply.choices[0].message.content == expected
    with pytest.raises(openai.BadRequestError, match="one user message, after any system messages"):
        client.chat.completions.create(model=name, messages=[*messages, *messages[:1]], max_tokens=2)


def _logged(caplog: pytest.LogCaptureFixture, start: str, timeout: float = 10.0) -> str:
    """The serve log's line starting ``start`` (a stream's is written just after its last event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if r.name == "fedtune.serve"]
        found = [line for line in lines if line.startswith(start)]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"no log line starting {start!r} in {lines}")


def test_every_request_is_logged_in_one_line(
    served: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    messages = [{"role": "user", "content": PROMPT}]
    with caplog.at_level(logging.INFO, logger="fedtune.serve"):
        # Execute: a whole answer, a stream, a refusal
        whole = client.chat.completions.create(model=name, messages=messages, max_tokens=4, temperature=0)
        whole_line = _logged(caplog, "POST /v1/chat/completions 200")
        caplog.clear()
        stream = client.completions.create(
            model=name, prompt=PROMPT, max_tokens=4, temperature=0, stream=True
        )
        assert list(stream)
        stream_line = _logged(caplog, "POST /v1/completions 200")
        httpx.post(f"{url}/completions", json={"prompt": PROMPT})  # no key
        refused_line = _logged(caplog, "POST /v1/completions 401")

    # Assert: method, path, status, tokens (the usage's total), milliseconds
    assert whole.usage is not None
    assert re.fullmatch(
        rf"POST /v1/chat/completions 200 tokens={whole.usage.total_tokens} \d+ ms", whole_line
    )
    assert re.fullmatch(r"POST /v1/completions 200 tokens=\d+ \d+ ms", stream_line)
    assert re.fullmatch(r"POST /v1/completions 401 tokens=- \d+ ms", refused_line)


class _Scorer(FinalModel):
    generates = False

    def evaluate(self, records: list[Any]) -> Any:
        raise NotImplementedError


def test_a_final_model_that_does_not_generate_is_refused() -> None:
    cfg = tiny_config("fedpft")
    with pytest.raises(FinalModelError, match="'fedpft' run scores but does not generate"):
        RunService(_Scorer(cfg, tokenizer=None), "x")


def test_serving_beyond_loopback_needs_the_flag(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "tiny-llama", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output


def test_validation_errors_are_400_naming_the_parameter(served: tuple[Path, str]) -> None:
    run_dir, url = served
    headers = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": _name(run_dir), "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for field, value in [("seed", 2**70), ("seed", -(2**70)), ("max_tokens", -1), ("top_p", 0)]:
        response = httpx.post(f"{url}/chat/completions", json={**chat, field: value}, headers=headers)
        assert response.status_code == 400, (field, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == field
        assert field in error["message"] and "Overflow" not in error["message"]
    response = httpx.post(f"{url}/chat/completions", json={**chat, "messages": "hi"}, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    # The largest valid seed is served.
    reply = _client(url).chat.completions.create(**chat, seed=2**63 - 1)
    assert reply.choices[0].message.content is not None


def test_prompt_and_max_tokens_are_bounded_by_the_models_context(served: tuple[Path, str]) -> None:
    run_dir, url = served
    client, name = _client(url), _name(run_dir)
    context = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]
    assert context["max_model_len"] == 1024  # the tiny Llama's max_position_embeddings
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024") as refused:
        client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": PROMPT}], max_tokens=10**6, temperature=0
        )
    assert refused.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="maximum context length") as long_prompt:
        client.completions.create(model=name, prompt="word " * 200_000, max_tokens=1)  # ~1 MB
    assert long_prompt.value.body["param"] == "prompt"  # type: ignore[index]
    # Up to the limit is served.
    assert client.completions.create(model=name, prompt=PROMPT, max_tokens=4).choices[0].text is not None


# ----- a slow model: one request must not wedge the server --------------------------------------------


class _Slow(FinalModel):
    """A run's final model whose every decoding step takes ``delay`` seconds and never ends early (no
    EOS): long generations on demand; ``steps`` counts the steps run."""

    def __init__(self, final: FinalModel, delay: float) -> None:
        super().__init__(final.cfg, final.tokenizer)
        self.final, self.delay, self.steps = final, delay, 0

    def evaluate(self, records: list[Any]) -> Any:
        raise NotImplementedError

    def context_length(self) -> int | None:
        return self.final.context_length()

    def decoder(self) -> Decoder:
        inner = self.final.decoder()
        assert inner is not None

        def step_fn() -> Any:
            step = inner.step_fn()

            def slow(*args: Any) -> Any:
                time.sleep(self.delay)
                self.steps += 1
                return step(*args)

            return slow

        return Decoder(step_fn, [], inner.device)


@pytest.fixture(scope="module")
def fedit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("slow") / "run"
    quiet_runner(tiny_config("fedit", *RUNS["fedit"]), run_dir).run()
    return run_dir


@pytest.fixture()
def slow(fedit_run: Path) -> Iterator[tuple[_Slow, BackgroundServer]]:
    """A server of the slow model (0.05 s a step) that takes 2 requests at once."""
    model = _Slow(load_final(fedit_run, None, {}), delay=0.05)
    server = BackgroundServer(build_app(RunService(model, "slow"), max_concurrent=2)).start()
    yield model, server
    server.stop()


def _settled(model: _Slow, timeout: float = 30.0) -> int:
    """The step count once no step has run for a second (fails when decoding goes on past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = model.steps
        time.sleep(1.0)
        if model.steps == before:
            return before
    raise AssertionError(f"the model was still decoding after {timeout} s")


def _chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, **extra}


def test_a_client_that_goes_away_stops_its_generation(slow: tuple[_Slow, BackgroundServer]) -> None:
    model, server = slow
    # Whole responses: the client gives up after 1 s of a 800-step (40 s) generation.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/chat/completions", json=_chat(800), timeout=1.0)
    assert _settled(model) < 800
    # Streamed: the client reads two chunks and closes the connection.
    with httpx.stream("POST", f"{server.url}/chat/completions", json=_chat(800, stream=True)) as response:
        lines = response.iter_lines()
        next(lines), next(lines)
    started = model.steps
    assert _settled(model) - started < 800


def test_requests_take_turns_and_a_full_server_answers_429(slow: tuple[_Slow, BackgroundServer]) -> None:
    model, server = slow
    client = _client(server.url, key="unused")
    done: list[str] = []

    def long() -> None:
        client.chat.completions.create(model="slow", **_chat(200))  # 10 s of steps, not streamed
        done.append("long")

    thread = threading.Thread(target=long)
    thread.start()
    while model.steps == 0:
        time.sleep(0.05)
    client.chat.completions.create(model="slow", **_chat(2))
    done.append("short")  # served between the long one's steps, not after them
    with client.chat.completions.create(model="slow", stream=True, **_chat(800)) as stream:
        next(iter(stream))
        with pytest.raises(openai.RateLimitError, match="busy"):  # 2 in flight: the third is refused
            client.chat.completions.create(model="slow", **_chat(2))
    thread.join(60)
    assert done == ["short", "long"]
    _settled(model)
    client.chat.completions.create(model="slow", **_chat(2))  # the slots were given back


def test_stopping_the_server_does_not_wait_for_generation(slow: tuple[_Slow, BackgroundServer]) -> None:
    model, server = slow
    thread = server._thread
    assert thread is not None

    def stream() -> None:
        with httpx.stream("POST", f"{server.url}/chat/completions", json=_chat(800, stream=True)) as response:
            for _ in response.iter_lines():
                pass

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    while model.steps < 3:
        time.sleep(0.05)
    started = time.monotonic()
    server.stop(timeout=30)
    assert not thread.is_alive() and time.monotonic() - started < 20  # 800 steps would take 40 s
    assert _settled(model) < 800


def test_many_requests_at_once_are_all_answered(fedit_run: Path) -> None:
    """A small load test (``bench/serve_load.py`` is the full one): 20 chat requests sent together on
    loopback, each with a timeout, all answered 200."""
    with BackgroundServer(build_app(run_service(fedit_run, served_name="tiny"))) as server:
        latencies, outcomes = fire(server.url, 20, max_tokens=4, timeout=120)
    assert outcomes == {"200": 20} and len(latencies) == 20


# ----- the CLI's address checks --------------------------------------------------------------------


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_refused_before_serving(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedtune.serve.launch.serve_forever", lambda *args: pytest.fail("served"))
    result = CliRunner().invoke(cli, ["serve", "tiny-llama", "--port", port])
    assert result.exit_code == 2 and "serving" not in result.output
    assert "--port" in result.output


@pytest.mark.parametrize(
    ("host", "shown"), [("::1", "[::1]"), ("[::1]", "[::1]"), ("localhost", "localhost")]
)
def test_loopback_hosts_are_bound_and_announced(
    host: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound: list[tuple[str, int]] = []

    def fake(app: Any, sock: socket.socket) -> None:
        bound.append(sock.getsockname()[:2])
        sock.close()

    monkeypatch.setattr("fedtune.serve.launch.serve_forever", fake)
    result = CliRunner().invoke(cli, ["serve", "tiny-llama", "--host", host, "--port", "0"])
    assert result.exit_code == 0, result.output
    ((address, port),) = bound
    assert port != 0 and address in ("::1", "127.0.0.1")
    assert f"http://{shown}:{port}/v1" in result.output  # the port it listens on, not 0


def test_a_port_in_use_is_refused_clearly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "tiny-llama", "--port", str(port)])
    assert result.exit_code != 0 and "serving" not in result.output
    assert f"127.0.0.1:{port}" in result.output
