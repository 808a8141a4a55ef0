from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fedtune.config import ExperimentConfig, load_config
from fedtune.models import llama_cpp
from fedtune.runner import Runner
from tests.golden.cases import VOLATILE

ROOT = Path(__file__).resolve().parents[2]


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
