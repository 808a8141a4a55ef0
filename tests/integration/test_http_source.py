"""FedPT's large model behind HTTP: ``HTTPLogitSource`` against ``fedtune serve MODEL`` on loopback.

One logits server (the tiny large model of configs/test/fedpt-tiny.yaml, no log-probability limit) serves
the module; the tests compare what comes over the wire with the same model run locally.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fedtune.cli import app as cli
from fedtune.data.records import Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.models.loading import load_causal_lm
from fedtune.proxy import ProxyTunedLM, VocabMismatch
from fedtune.proxy.http_source import (
    HTTPLogitSource,
    HTTPSettings,
    LargeModelMisbehaved,
    LargeModelRefused,
    LargeModelUnavailable,
)
from fedtune.proxy.source import LocalLogitSource
from fedtune.serve import BackgroundServer, LogitsService, build_app
from tests.integration.helpers import quiet_runner, stable, tiny_config

LARGE = "tiny-llama-L4-H64"
WIDTH = 262  # the byte-level tiny tokenizer's size: k = WIDTH is the whole vocabulary


@pytest.fixture(scope="module")
def service() -> LogitsService:
    model, tokenizer = load_causal_lm(LARGE, seed=0)
    return LogitsService(model, tokenizer, LARGE, max_logprobs=-1)


@pytest.fixture(scope="module")
def server(service: LogitsService) -> Iterator[BackgroundServer]:
    with BackgroundServer(build_app(service)) as running:
        yield running


@pytest.fixture(scope="module")
def small_tokenizer() -> Any:
    return load_causal_lm("tiny-llama")[1]


@pytest.fixture(scope="module")
def batch(small_tokenizer: Any) -> dict[str, torch.Tensor]:
    records = [Record(f"Synonym of 'word{i}'?", f"answer {i}" * (1 + i % 3)) for i in range(5)]
    examples = encode_records(records, small_tokenizer, "plain", 48)
    return make_batches(examples, 5, int(small_tokenizer.pad_token_id), seed=0)[0]


def _source(server: BackgroundServer, tokenizer: Any, k: int, **settings: Any) -> HTTPLogitSource:
    return HTTPLogitSource.connect(server.url, tokenizer, settings=HTTPSettings(top_k=k, **settings))


@pytest.mark.parametrize("k", [5, WIDTH])
def test_labelled_logprobs_are_the_local_models_on_the_top_k(
    server: BackgroundServer, service: LogitsService, small_tokenizer: Any, batch: Any, k: int
) -> None:
    source = _source(server, small_tokenizer, k)
    assert source.model == LARGE and source.vocab_width == WIDTH
    top = source.labelled_logprobs(batch)
    exact = torch.log_softmax(
        LocalLogitSource(service.model, service.tokenizer).labelled_logits(batch), dim=-1
    )
    assert top.logprobs.shape == exact.shape
    torch.testing.assert_close(top.logprobs[top.known], exact[top.known], rtol=0, atol=1e-5)
    # Exactly the top k, plus the label where it is not among them.
    labels = batch["labels"][:, 1:][batch["labels"][:, 1:] != -100]
    named = top.known.sum(dim=1)
    in_top = (exact.topk(k).indices == labels[:, None]).any(dim=1)
    assert torch.equal(named, k + (~in_top).long())
    assert bool(top.known[torch.arange(len(labels)), labels].all())
    torch.testing.assert_close(top.logprobs.exp().sum(dim=1), torch.ones(len(labels)), rtol=0, atol=1e-4)
    if k == WIDTH:
        torch.testing.assert_close(top.logprobs, exact, rtol=0, atol=1e-5)
    # One request per row, the bytes counted.
    assert source.usage.requests >= 3 + 5 and source.usage.bytes_down > source.usage.bytes_up > 0


def test_proxy_decoding_over_http_writes_the_local_text(
    server: BackgroundServer, service: LogitsService, small_tokenizer: Any
) -> None:
    small, tokenizer = load_causal_lm("tiny-llama", seed=1)
    from fedtune.config import LoraConfig
    from fedtune.models.lora import build_lora

    peft = build_lora(small, LoraConfig(r=4, alpha=8, dropout=0.0), seed=0)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    prompts = ["Define 'cat'.", "Give an antonym of 'happy'.", "Hi"]
    local = ProxyTunedLM(LocalLogitSource(service.model, service.tokenizer), peft, tokenizer, alpha=1.5)
    remote_source = _source(server, small_tokenizer, WIDTH)
    remote = ProxyTunedLM(remote_source, peft, tokenizer, alpha=1.5)
    expected = local.generate(prompts, max_new_tokens=8, batch_size=3)
    assert remote.generate(prompts, max_new_tokens=8, batch_size=3) == expected
    # A small k still decodes (the candidates: the top k and every token the small models rate).
    assert (
        len(
            ProxyTunedLM(_source(server, small_tokenizer, 5), peft, tokenizer, alpha=1.5).generate(
                prompts, max_new_tokens=8, batch_size=3
            )
        )
        == 3
    )


def test_a_tokenizer_mismatch_is_refused_at_connect(server: BackgroundServer) -> None:
    _, other = load_causal_lm("tiny-llama-bpe")
    with pytest.raises(VocabMismatch, match=server.url.replace(".", r"\.")):
        HTTPLogitSource.connect(server.url, other)


def test_refusals_and_an_absent_server_name_the_url(
    server: BackgroundServer, service: LogitsService, small_tokenizer: Any
) -> None:
    with pytest.raises(LargeModelRefused, match=r"not 'nope'.*large_model_name"):
        HTTPLogitSource.connect(server.url, small_tokenizer, model="nope")
    limited = LogitsService(service.model, service.tokenizer, LARGE)  # vLLM's default limit: 20
    with BackgroundServer(build_app(limited)) as strict:
        source = _source(strict, small_tokenizer, 21)
        with pytest.raises(LargeModelRefused, match=r"greater than max allowed: 20.*fedpt\.top_k"):
            source.labelled_logits({k: v[:1] for k, v in _one_row(small_tokenizer).items()})
        port = strict.port
    with pytest.raises(LargeModelUnavailable, match=rf"127\.0\.0\.1:{port}/v1.*3 attempts.*fedtune resume"):
        HTTPLogitSource.connect(
            f"http://127.0.0.1:{port}/v1", small_tokenizer, settings=HTTPSettings(retries=2, backoff=0.01)
        )


def _one_row(tokenizer: Any) -> dict[str, torch.Tensor]:
    examples = encode_records([Record("Define 'cat'.", "an animal")], tokenizer, "plain", 64)
    return make_batches(examples, 1, int(tokenizer.pad_token_id), seed=0)[0]


# ----- FedPT over HTTP ----------------------------------------------------------------------------
HTTP_RUN = ("fedpt.top_k=262", "fedpt.api_retries=2", "fedpt.api_backoff=0.01", "eval.before=false")


def _without_api(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for row in stable(history):
        row = {k: v for k, v in row.items() if not k.startswith("api_")}
        if "eval" in row:
            row["eval"] = {k: v for k, v in row["eval"].items() if not k.startswith("api_")}
        rows.append(row)
    return rows


def _close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats to 1e-5 relative (the teacher arrives as log-probabilities, not raw logits)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (path, a, b)
    else:
        assert a == b, path


@pytest.fixture(scope="module")
def interrupted(
    service: LogitsService, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, list[dict[str, Any]]]:
    """A FedPT run over HTTP whose server goes down in round 2 (the run stops with an error), then
    comes back on the same port and `fedtune resume` finishes the run: the run directory, the error,
    and the final metrics."""
    first = BackgroundServer(build_app(service)).start()
    cfg = tiny_config("fedpt", f"fedpt.large_model={first.url}", *HTTP_RUN)

    def stop_in_round_2(client: str, task: str, rnd: int) -> None:
        if rnd == 2:
            first.stop()

    run_dir = tmp_path_factory.mktemp("http") / "run"
    try:
        with pytest.raises(LargeModelUnavailable) as failure:
            quiet_runner(cfg, run_dir, before_task=stop_in_round_2).run()
    finally:
        first.stop()
    assert not (run_dir / "artifacts").exists()
    with BackgroundServer(build_app(service), port=first.port):
        result = CliRunner().invoke(cli, ["resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, str(failure.value), history


def test_server_down_mid_run_is_retried_then_named(interrupted: tuple[Path, str, Any]) -> None:
    run_dir, error, history = interrupted
    url = _config_url(run_dir)
    assert url.startswith("http://127.0.0.1:") and f"the large model at {url} did not answer" in error
    assert "after 3 attempts" in error and "fedtune resume" in error  # api_retries=2
    assert [row["round"] for row in history] == [0, 1, 2] and (run_dir / "artifacts" / "proxy.json").is_file()


def _config_url(run_dir: Path) -> str:
    import yaml

    return str(yaml.safe_load((run_dir / "config.yaml").read_text())["fedpt"]["large_model"])


def test_fedpt_over_http_with_the_whole_vocabulary_is_the_local_run(
    interrupted: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, _, history = interrupted  # interrupted in round 2 and resumed: the same as never interrupted
    local = quiet_runner(tiny_config("fedpt", "eval.before=false"), tmp_path / "local").run()
    _close(_without_api(history), _without_api(local))
    # What the API cost is in the metrics: the teacher's requests (round 1 only: cached on disk after),
    # and the evaluation's (decoding and perplexity) in every evaluated round.
    first, second = history[1], history[2]
    assert first["api_requests"] == 16 and second["api_requests"] == 0  # 16 public examples, 1 row each
    assert first["api_bytes_down"] > first["api_bytes_up"] > 0 and first["api_seconds"] > 0
    assert (
        first["eval"]["api_requests"] > 0 and second["eval"]["api_requests"] > first["eval"]["api_requests"]
    )
    assert all("api_requests" not in row and "api_requests" not in row.get("eval", {}) for row in local)


def test_eval_reaches_the_large_model_another_way_than_the_run_did(
    interrupted: tuple[Path, str, list[dict[str, Any]]],
) -> None:
    """A run made over HTTP (its server gone now) is scored on the local weights of the same model
    with ``--option large_model``: the run's final metrics (k = V: nothing was filled)."""
    run_dir, _, history = interrupted
    result = CliRunner().invoke(cli, ["eval", str(run_dir), "--option", f"large_model={LARGE}"])
    assert result.exit_code == 0, result.output
    scored = json.loads((run_dir / "eval.json").read_text())
    final = history[-1]["eval"]
    for key in ("rougeL", "perplexity"):
        assert math.isclose(scored["metrics"][key], final[key], rel_tol=1e-5), key
    refused = CliRunner().invoke(cli, ["eval", str(run_dir), "--option", "top_k=many"])
    assert refused.exit_code != 0 and "--option top_k='many' is not an integer" in refused.output


def test_the_cli_names_an_absent_large_model(tmp_path: Path) -> None:
    config = str(Path(__file__).resolve().parents[2] / "configs" / "test" / "fedpt-tiny.yaml")
    result = CliRunner().invoke(
        cli,
        [
            "run",
            config,
            "fedpt.large_model=http://127.0.0.1:9/v1",
            "fedpt.api_retries=1",
            "fedpt.api_backoff=0.01",
            "-o",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2
    assert "http://127.0.0.1:9/v1" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "checkpoints").exists()


class Inflating(LogitsService):
    """A server whose prompt log-probabilities are all 5 nats too high: a teacher better than any model."""

    def _prompt_logprobs(self, ids: list[int]) -> torch.Tensor:
        return super()._prompt_logprobs(ids) + 5.0


def test_a_run_against_a_lying_large_model_stops_before_training_on_it(
    service: LogitsService, tmp_path: Path
) -> None:
    # Prepare: the honest model behind a server that inflates every log-probability
    lying = Inflating(service.model, service.tokenizer, LARGE, max_logprobs=-1)
    with BackgroundServer(build_app(lying)) as running:
        cfg = tiny_config("fedpt", f"fedpt.large_model={running.url}", *HTTP_RUN)

        # Execute
        with pytest.raises(LargeModelMisbehaved) as failure:
            quiet_runner(cfg, tmp_path / "run").run()

    # Assert: the reason names the URL, the position and the value; nothing was distilled from it
    assert running.url in str(failure.value) and "3 attempts" in str(failure.value)
    # Each value alone could be a log-probability (the tiny model is near uniform over 262 ids); together
    # they hold far more than probability 1.
    assert "prompt position 1: the named ids hold probability" in str(failure.value)
    assert not (tmp_path / "run" / "artifacts").exists()
