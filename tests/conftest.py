from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Subprocesses started by tests (the CLI) sleep instead of spin-waiting between parallel regions,
# which keeps them from starving each other on a small shared machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def pytest_configure(config: pytest.Config) -> None:
    """Tiny models gain nothing from intra-op threads; one thread keeps them fast under load."""
    markers = str(config.getoption("markexpr") or "")
    if "slow" not in markers or "not slow" in markers:
        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the CLI subprocesses of the integration tests


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA device (CI, laptops): they
    still import and collect everywhere, so a broken GPU test shows before a GPU is at hand."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def tiny_config_path() -> Path:
    return TINY_CONFIG
