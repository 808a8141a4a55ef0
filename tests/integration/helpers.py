from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fedtune.config import ExperimentConfig, load_config
from fedtune.models import llama_cpp
from fedtune.runner import Runner
from tests.golden.cases import VOLATILE

ROOT = Path(__file__).resolve().parents[2]


SLOW_ON_SHARED_BACKENDS = {
    "fedyogi": "FedAdam's rounds but the second-moment update (tests/unit/test_fedopt.py checks it)",
    "fedadagrad": "FedAdam's rounds but the second-moment update (tests/unit/test_fedopt.py checks it)",
    "hetlora": "FlexLoRA's clients and messages (algorithms/hetrank) with its own server maths",
    "fedadam": "FedIT's client task (algorithms/fedopt/client.py: fit_adapter unchanged) and messages",
}
"""Methods whose Flower and Ray equality runs (a minute and 10-25 s a method) are in the slow tier only:
each runs the same client code and messages as a method that stays in the default tier."""

SLOW_ON_FLOWER = {
    "flexlora": "adapters at per-client shapes, as FedMKT's per-client messages; its Ray run stays",
}
"""Methods whose Flower equality run (1.5-3 minutes on two busy cores) is in the slow tier only: the Flower
codec maps any payload one-to-one, and another method in the default tier sends messages of the same kind."""


# With beta1 = 0 and tau far above every |Delta|, an adaptive step is Delta * server_lr / (sqrt(v) + tau):
# Delta itself (to |Delta| / tau) when server_lr is tau for FedAdam with beta2 = 0 (sqrt(v) = |Delta|)
# and 2 tau for FedYogi and FedAdagrad (v near tau^2). The model then moves by the release alone, which
# test_privacy and test_secagg bound.
ADAPTIVE_STEP_IS_THE_RELEASE = {
    "fedadam": ("fedadam.beta1=0", "fedadam.beta2=0", "fedadam.tau=1000", "fedadam.server_lr=1000"),
    "fedyogi": ("fedyogi.beta1=0", "fedyogi.beta2=0", "fedyogi.tau=1000", "fedyogi.server_lr=2000"),
    "fedadagrad": ("fedadagrad.beta1=0", "fedadagrad.tau=1000", "fedadagrad.server_lr=2000"),
}


def default_tier(algorithms: Iterable[str], *, also_slow: Iterable[str] = ()) -> list[Any]:
    """``algorithms`` as pytest parameters, those in ``SLOW_ON_SHARED_BACKENDS`` (or ``also_slow``) marked
    slow."""
    slow, later = pytest.mark.slow, {*SLOW_ON_SHARED_BACKENDS, *also_slow}
    return [pytest.param(a, marks=slow) if a in later else a for a in algorithms]


def tiny_config(algorithm: str, *overrides: str) -> ExperimentConfig:
    path = ROOT / "configs" / "test" / f"{algorithm}-tiny.yaml"
    assert path.is_file(), f"every registered algorithm needs {path} for the contract test"
    return load_config(path, list(overrides))


def quiet_runner(cfg: ExperimentConfig, run_dir: Path, **hooks: Any) -> Runner:
    return Runner(cfg, run_dir, console=Console(quiet=True), **hooks)


def stable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics rows without wall-clock and memory readings (which legitimately differ)."""
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in history]


LLAMA_SDIST_TOP = f"llama_cpp_python-{llama_cpp.VERSION}"


def fake_llama_sdist(path: Path, files: dict[str, bytes]) -> Path:
    """A .tar.gz laid out like llama-cpp-python's sdist (``files`` by their full member names), plus a
    symlink inside the converter's package that extraction must not follow."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{LLAMA_SDIST_TOP}/vendor/llama.cpp/conversion/passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    return path


def pin_fake_llama_sdist(
    sdist: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[llama_cpp.SdistDownloader, list[str]]:
    """A downloader that copies ``sdist``, whose sha256 is made the pinned one; and its call log."""
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    calls: list[str] = []

    def download(requirement: str, destination: Path) -> None:
        calls.append(requirement)
        (destination / sdist.name).write_bytes(sdist.read_bytes())

    return download, calls
