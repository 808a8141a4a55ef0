"""llama.cpp's converter fetched from the llama-cpp-python sdist: on a small fake sdist built here, with
its sha256 pinned through monkeypatch; no download except the one that is meant to fail."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from fedtune.models import llama_cpp
from fedtune.models.llama_cpp import (
    CONVERTER_NAME,
    SdistDownloader,
    converter_dir,
    extract_converter,
    fetch_converter,
    kept_path,
)
from fedtune.models.zoo import MARKER_FILE, ZooError
from tests.integration.helpers import LLAMA_SDIST_TOP, fake_llama_sdist, pin_fake_llama_sdist

TOP = LLAMA_SDIST_TOP
CONVERTER_FILES = {
    f"{TOP}/vendor/llama.cpp/{CONVERTER_NAME}": b"print('converter')\n",
    f"{TOP}/vendor/llama.cpp/conversion/__init__.py": b"",
    f"{TOP}/vendor/llama.cpp/gguf-py/gguf/__init__.py": b"SOURCE = 'gguf-py'\n",
    f"{TOP}/vendor/llama.cpp/LICENSE": b"MIT\n",
}
OTHER_FILES = {
    f"{TOP}/llama_cpp/__init__.py": b"",
    f"{TOP}/vendor/llama.cpp/src/llama.cpp": b"int main() {}\n",
    f"{TOP}/vendor/llama.cpp/conversion-notes.txt": b"",
    f"{TOP}/vendor/llama.cpp/conversion/../../../escape.py": b"",
}


def pinned_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SdistDownloader, list[str]]:
    sdist = fake_llama_sdist(tmp_path / f"{TOP}.tar.gz", {**CONVERTER_FILES, **OTHER_FILES})
    return pin_fake_llama_sdist(sdist, monkeypatch)


def files_under(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir()}


def test_kept_path_keeps_the_converter_and_drops_the_rest() -> None:
    assert kept_path(f"{TOP}/vendor/llama.cpp/gguf-py/gguf/constants.py") == PurePosixPath(
        "gguf-py/gguf/constants.py"
    )
    assert kept_path(f"{TOP}/vendor/llama.cpp/{CONVERTER_NAME}") == PurePosixPath(CONVERTER_NAME)
    for dropped in [*OTHER_FILES, f"{TOP}/vendor/llama.cpp", f"{TOP}/{CONVERTER_NAME}"]:
        assert kept_path(dropped) is None, dropped


def test_fetch_extracts_only_the_converter_and_marks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    download, calls = pinned_fake(tmp_path, monkeypatch)

    script = fetch_converter(cache_dir=tmp_path / "cache", progress=False, downloader=download)

    assert calls == [f"llama-cpp-python=={llama_cpp.VERSION}"]
    assert script == converter_dir(tmp_path / "cache") / CONVERTER_NAME
    assert script.read_text() == "print('converter')\n"
    assert files_under(script.parent) == {
        CONVERTER_NAME, "conversion/__init__.py", "gguf-py/gguf/__init__.py", "LICENSE", MARKER_FILE,
    }  # fmt: skip
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "cache" / "escape.py").exists()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_a_fetched_converter_is_reused_without_downloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    download, calls = pinned_fake(tmp_path, monkeypatch)
    first = fetch_converter(cache_dir=tmp_path / "cache", progress=False, downloader=download)

    again = fetch_converter(cache_dir=tmp_path / "cache", progress=False, downloader=download)

    assert again == first and len(calls) == 1


def test_a_sha256_mismatch_names_the_file_and_both_hashes_and_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    download, _ = pinned_fake(tmp_path, monkeypatch)
    actual = llama_cpp.SDIST_SHA256
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", "0" * 64)

    with pytest.raises(ZooError) as raised:
        fetch_converter(cache_dir=tmp_path / "cache", progress=False, downloader=download)

    message = str(raised.value)
    assert f"{TOP}.tar.gz" in message and "0" * 64 in message and actual in message
    assert not converter_dir(tmp_path / "cache").exists()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_an_sdist_without_the_converter_is_refused(tmp_path: Path) -> None:
    sdist = fake_llama_sdist(tmp_path / "old.tar.gz", OTHER_FILES)

    with pytest.raises(ZooError, match=f"old.tar.gz holds no vendor/llama.cpp/{CONVERTER_NAME}"):
        extract_converter(sdist, tmp_path / "out")


def test_no_reachable_registry_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pip with no configuration and no index: what a machine without the registry gets.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")

    with pytest.raises(ZooError) as raised:
        fetch_converter(cache_dir=tmp_path, progress=False)

    message = str(raised.value)
    assert f"pip could not download the source of llama-cpp-python=={llama_cpp.VERSION}" in message
    assert "registry must be reachable" in message and CONVERTER_NAME in message
    assert not converter_dir(tmp_path).exists()
