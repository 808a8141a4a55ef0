"""The models ``fedtune models derive`` saved in the cache: their names and their records.

Each lives in ``<cache>/derived/<name>/`` beside its ``derive.json`` (`fedtune.train.distill.DeriveResult`),
which is written last and so marks the directory as complete.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fedtune.models.loading import DERIVED_DIR, DERIVED_MARKER
from fedtune.models.zoo import default_cache_dir, zoo_names

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def default_derived_name(source: str, keep_layers: int) -> str:
    """``smollm2-135m-instruct`` with 10 layers -> ``smollm2-135m-instruct-l10``."""
    return f"{Path(source).name}-l{keep_layers}"


def check_derived_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad derived model name {name!r}: use letters, digits, '.', '_' and '-'")
    if name in zoo_names() or name.startswith("tiny-"):
        raise ValueError(f"{name!r} would be loaded as a zoo or tiny model; choose another name")


def list_derived(cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """The ``derive.json`` records of the derived models in the cache, each with its ``path``."""
    root = (cache_dir or default_cache_dir()) / DERIVED_DIR
    if not root.is_dir():
        return []
    records = []
    for marker in sorted(root.glob(f"*/{DERIVED_MARKER}")):
        record = json.loads(marker.read_text())
        records.append({**record, "path": str(marker.parent)})
    return records


def derived_table(cache_dir: Path | None = None) -> list[dict[str, str]]:
    """One row per derived model for ``fedtune models list``."""
    return [
        {
            "name": record["name"],
            "source": record["source"],
            "layers": f"{len(record['kept_layers'])} of {record['source_layers']}",
            "params": f"{record['params'] / 1e6:.1f}M",
            "distilled": f"{record['steps']} steps",
            "ppl teacher / derived": f"{record['teacher_ppl']:.2f} / {record['student_ppl_after']:.2f}",
            "path": record["path"],
        }
        for record in list_derived(cache_dir)
    ]
