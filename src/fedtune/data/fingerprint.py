"""What a run trained on, pinned: the absolute path and sha256 of every data file, and a hash of the
partition. ``fedtune resume`` compares them with what it would load now, so a resumed run never
silently trains on other data (another working directory, an edited file, another partition).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedtune.data.records import Record
from fedtune.errors import RunError


class DataChanged(RunError):
    """The data a run would resume on is not the data it started on."""


def absolute_data_path(spec: str) -> str:
    """``spec`` as an absolute path when it names an existing file or directory, else unchanged."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    if path.is_dir():
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(child.relative_to(path)).encode())
            digest.update(file_sha256(child).encode())
        return digest.hexdigest()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def partition_sha256(clients: Mapping[str, Sequence[Record]]) -> str:
    """A hash of which records each client holds, in order."""
    digest = hashlib.sha256()
    for client in sorted(clients):
        digest.update(client.encode())
        for record in clients[client]:
            digest.update(json.dumps(record.to_dict(), sort_keys=True).encode())
    return digest.hexdigest()


def data_fingerprint(specs: Mapping[str, str], clients: Mapping[str, Sequence[Record]]) -> dict[str, Any]:
    """``specs`` (config key -> dataset name or path): every one that is a file gets its sha256."""
    files = {
        key: {"path": spec, "sha256": file_sha256(Path(spec))}
        for key, spec in specs.items()
        if Path(spec).exists()
    }
    return {"files": files, "partition_sha256": partition_sha256(clients)}


def check_fingerprint(saved: Mapping[str, Any], now: Mapping[str, Any], source: Path) -> None:
    """Raise ``DataChanged`` naming the file (or the partition) that differs from ``saved``."""
    for key, entry in saved.get("files", {}).items():
        path = Path(entry["path"])
        if not path.exists():
            raise DataChanged(f"{key}: {path} is gone since the run started (pinned in {source})")
        if now.get("files", {}).get(key, {}).get("sha256") != entry["sha256"]:
            raise DataChanged(f"{key}: {path} changed since the run started (sha256 pinned in {source})")
    if saved.get("partition_sha256") != now.get("partition_sha256"):
        raise DataChanged(
            f"the client partition differs from the one the run started with (pinned in {source}); "
            "check data.partition and the data files"
        )
