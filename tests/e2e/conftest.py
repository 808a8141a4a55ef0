"""A short FedIT run on the zoo's SmolLM2, shared by the export round-trip tests (GGUF in llama.cpp, the
exports served by vLLM): one round of 2 local steps, or the run named by ``$FEDTUNE_E2E_FEDIT_RUN``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedtune.config import load_config
from tests.integration.helpers import ROOT, quiet_runner

DEMO = ROOT / "configs" / "demo" / "fedit-smollm2.yaml"
SHORT = ("fed.rounds=1", "train.max_steps=2", "eval.max_examples=4")
PROMPTS = (
    "Give a synonym of the word 'happy'.",
    "Define the word 'harbor'.",
    "What is the opposite of 'ancient'?",
    "Use the word 'bright' in a sentence.",
    "Name a kind of tree.",
)
"""Instructions whose greedy continuations the exports must reproduce."""


@pytest.fixture(scope="session")
def smollm2_fedit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("FEDTUNE_E2E_FEDIT_RUN")
    if given:
        return Path(given)
    run_dir = tmp_path_factory.mktemp("fedit-smollm2") / "run"
    quiet_runner(load_config(DEMO, list(SHORT)), run_dir).run()
    return run_dir
