from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


@pytest.fixture
def tiny_config_path() -> Path:
    return TINY_CONFIG
