"""Datasets shipped inside the package, usable offline.

Each lives in ``builtin/<name>/`` as ``<split>.jsonl.gz`` files plus ``meta.json`` and the
source's ``NOTICE``; ``scripts/make_datasets.py`` regenerates them byte for byte.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from fedtune.data.records import DataError, Record
from fedtune.suggest import closest

BUILTIN_DIR = Path(__file__).parent / "builtin"


@dataclass(frozen=True)
class BuiltinInfo:
    name: str
    description: str
    task: str  # "generation" | "math" | "classification" | "code" | "multiple_choice"
    categories: tuple[str, ...]
    splits: dict[str, int]  # split name -> number of examples
    licence: str
    path: Path


def _builtin_names() -> list[str]:
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(entry.name for entry in BUILTIN_DIR.iterdir() if (entry / "meta.json").is_file())


def list_builtin() -> list[BuiltinInfo]:
    return [builtin_info(name) for name in _builtin_names()]


def builtin_info(name: str) -> BuiltinInfo:
    names = _builtin_names()
    if name not in names:
        close = closest(name, names)
        hint = f"; did you mean '{close}'?" if close else ""
        raise DataError(f"unknown built-in dataset '{name}'{hint} (available: {', '.join(names)})")
    path = BUILTIN_DIR / name
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    return BuiltinInfo(
        name=name,
        description=meta["description"],
        task=meta["task"],
        categories=tuple(meta["categories"]),
        splits=dict(meta["splits"]),
        licence=meta["licence"],
        path=path,
    )


ALL_PUBLIC = "all"
"""As a public set's name: every built-in dataset's public split (`load_all_public`)."""


def load_all_public() -> list[Record]:
    """Every built-in dataset's public split, concatenated in name order: a general corpus."""
    return [
        r for info in list_builtin() if "public" in info.splits for r in load_builtin(info.name, "public")
    ]


def load_builtin(name: str, split: str = "train") -> list[Record]:
    info = builtin_info(name)
    if split not in info.splits:
        raise DataError(f"built-in dataset '{name}' has no split '{split}' (valid: {', '.join(info.splits)})")
    # The files are generated and checked by our own script, so rows map straight onto Record.
    with gzip.open(info.path / f"{split}.jsonl.gz", "rt", encoding="utf-8") as handle:
        return [Record.from_dict(json.loads(line)) for line in handle]
