"""llama.cpp's HF-to-GGUF converter, fetched once from the package registry.

No wheel ships ``convert_hf_to_gguf.py``, but the source distribution of llama-cpp-python vendors the
whole llama.cpp tree. `fetch_converter` downloads that sdist (``pip download --no-binary :all:``, once),
verifies its pinned sha256, and extracts only the converter: the script, its ``conversion/`` package and
``gguf-py/`` (the ``gguf`` package of the same llama.cpp revision, which the script puts on its own path).
Its Python requirements besides fedtune's are the ``gguf`` extra (``pip install 'fedtune[gguf]'``).

The pinned version is the newest whose converter turns the zoo's SmolLM2 into a GGUF file that
llama.cpp's runtime (llama-cpp-python built from the same sdist) loads and decodes as transformers does.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from fedtune.models.zoo import (
    ZooError,
    commit_dir,
    default_cache_dir,
    is_complete,
    progress_bars,
    sha256_file,
    work_dir,
    write_marker,
)

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CONVERTER_NAME = "convert_hf_to_gguf.py"
VENDORED = "vendor/llama.cpp"
"""Where llama.cpp sits inside the sdist (below its top-level ``llama_cpp_python-<version>/``)."""
KEPT = (CONVERTER_NAME, "conversion", "gguf-py", "LICENSE")
"""What is extracted from llama.cpp's tree: the converter, the modules it imports, the licence."""

SdistDownloader = Callable[[str, Path], None]
"""Puts the sdist of the ``package==version`` requirement into the given directory."""


def pip_download_sdist(requirement: str, destination: Path) -> None:
    """The default downloader: ``pip download --no-deps --no-binary :all:`` with this interpreter's pip."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--disable-pip-version-check", "--quiet", "-d", str(destination), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ZooError(
            f"pip could not download the source of {requirement}, which holds llama.cpp's {CONVERTER_NAME} "
            f"(the package registry must be reachable once):\n{result.stderr.strip()[-2000:]}"
        )


def converter_dir(cache_dir: Path | None = None) -> Path:
    """Where the pinned converter lives in the cache (whether or not it has been fetched)."""
    return (cache_dir or default_cache_dir()) / "llama.cpp" / VERSION


def fetch_converter(
    cache_dir: Path | None = None, progress: bool = True, downloader: SdistDownloader | None = None
) -> Path:
    """The path of ``convert_hf_to_gguf.py``, fetched from the pinned llama-cpp-python sdist on first use."""
    target = converter_dir(cache_dir)
    if is_complete(target, SDIST_SHA256):
        return target / CONVERTER_NAME
    requirement = f"{PACKAGE}=={VERSION}"
    with work_dir(cache_dir or default_cache_dir()) as work, progress_bars(progress) as bars:
        bars.add_task(f"download {requirement} (source, about 77 MB, once) for {CONVERTER_NAME}", total=None)
        (work / "sdist").mkdir()
        (downloader or pip_download_sdist)(requirement, work / "sdist")
        sdist = _the_sdist(work / "sdist", requirement)
        actual = sha256_file(sdist)
        if actual != SDIST_SHA256:
            raise ZooError(
                f"sha256 mismatch for {sdist.name} ({requirement}): expected {SDIST_SHA256}, got {actual}"
            )
        staging = work / "converter"
        extract_converter(sdist, staging)
        write_marker(staging, SDIST_SHA256, f"{requirement} ({sdist.name})")
        return commit_dir(staging, target, SDIST_SHA256) / CONVERTER_NAME


def _the_sdist(directory: Path, requirement: str) -> Path:
    found = sorted(directory.glob("*.tar.gz"))
    if len(found) != 1:
        names = ", ".join(p.name for p in directory.iterdir()) or "nothing"
        raise ZooError(f"expected one .tar.gz source distribution of {requirement}, got {names}")
    return found[0]


def kept_path(member: str) -> PurePosixPath | None:
    """``member``'s path below llama.cpp's directory when it is part of the converter, else None.

    ``llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf/constants.py`` -> ``gguf-py/gguf/constants.py``.
    """
    parts = PurePosixPath(member).parts
    vendored = PurePosixPath(VENDORED).parts
    inside = parts[1 : 1 + len(vendored)] == vendored
    rest = parts[1 + len(vendored) :]
    if not inside or not rest or rest[0] not in KEPT or ".." in rest:
        return None
    return PurePosixPath(*rest)


def extract_converter(sdist: Path, destination: Path) -> None:
    """Extract the converter's files (`KEPT`) from the sdist into ``destination``; plain files only."""
    destination.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:
            relative = kept_path(member.name)
            source = archive.extractfile(member) if member.isfile() and relative else None
            if source is None or relative is None:
                continue
            path = destination / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with source, path.open("wb") as out:
                out.write(source.read())
    if not (destination / CONVERTER_NAME).is_file():
        raise ZooError(f"{sdist.name} holds no {VENDORED}/{CONVERTER_NAME}")
