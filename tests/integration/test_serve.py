"""`fedtune serve RUN_DIR` through the official `openai` client: a FedIT run (LoRA merged) and a FedPT
run (proxy-tuned decoding), completions, chat, streaming, errors, the bearer token and the host rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.artifacts import generate_from_run, run_config
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
    with pytest.raises(openai.UnprocessableEntityError) as invalid:
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
        with pytest.raises(openai.BadRequestError, match="exactly one user message"):
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
    assert httpx.get(f"{root}/health").status_code == 200  # open without the key


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
