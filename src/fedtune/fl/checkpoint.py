"""Atomic checkpoints: a round's state is visible only once completely written.

A checkpoint is a directory ``checkpoints/round_NNNN/`` with ``arrays.safetensors`` (every array
of the state tree) and ``state.json`` (the rest, with references to the arrays). It is written
under a temporary name, fsynced and renamed, then ``checkpoints/LATEST`` is replaced atomically.
A process killed at any moment leaves either the previous or the new checkpoint, never half of one.

``manifest.json`` (written last) holds the sha256 of both files; ``load_checkpoint`` verifies them, so
a checkpoint damaged on disk later (flipped bytes, truncation, a lost file) is refused, never loaded.
``intact_checkpoint`` finds the newest checkpoint that verifies and names each damaged one it passed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from fedtune.errors import RunError
from fedtune.files import honour_umask

MANIFEST = "manifest.json"
FILES = ("arrays.safetensors", "state.json")
_ARRAY = "__array__"


class CheckpointDamaged(RunError):
    """A checkpoint's files are missing or differ from its manifest; the message names the file."""


_TUPLE = "__tuple__"


def _encode(node: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, torch.Tensor):
        node = node.detach().cpu().float().numpy() if node.dtype == torch.bfloat16 else node.cpu().numpy()
    if isinstance(node, np.ndarray):
        arrays[path] = np.ascontiguousarray(node)
        return {_ARRAY: path}
    if isinstance(node, dict):
        return {str(k): _encode(v, f"{path}/{k}", arrays) for k, v in node.items()}
    if isinstance(node, tuple):
        return {_TUPLE: [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(node)]}
    if isinstance(node, list):
        return [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(node)]
    if isinstance(node, np.generic):
        return node.item()
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise TypeError(f"checkpoint: cannot store {type(node).__name__} at {path}")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, dict):
        if _ARRAY in node:
            return arrays[node[_ARRAY]]
        if _TUPLE in node:
            return tuple(_decode(v, arrays) for v in node[_TUPLE])
        return {k: _decode(v, arrays) for k, v in node.items()}
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    return node


def encode_tree(tree: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``tree`` as a JSON-able skeleton plus its arrays (tensors become numpy, bf16 becomes fp32)."""
    arrays: dict[str, np.ndarray] = {}
    return _encode(tree, "", arrays), arrays


def decode_tree(skeleton: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The inverse of ``encode_tree``."""
    return _decode(skeleton, arrays)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write_file(tmp, text.encode())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(run_dir: Path, rnd: int, tree: dict[str, Any], keep: int = 2) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"round_{rnd:04d}"
    tmp = root / f".tmp_round_{rnd:04d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    arrays: dict[str, np.ndarray] = {}
    encoded = _encode(tree, "", arrays)
    save_file(arrays, str(tmp / "arrays.safetensors"))
    honour_umask(tmp / "arrays.safetensors")  # safetensors writes it 0600
    with open(tmp / "arrays.safetensors", "rb+") as handle:
        os.fsync(handle.fileno())
    _write_file(tmp / "state.json", json.dumps(encoded).encode())
    digests = {name: _sha256(tmp / name) for name in FILES}
    _write_file(tmp / MANIFEST, json.dumps({"sha256": digests}, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    atomic_write_text(root / "LATEST", final.name + "\n")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    rounds = sorted(p for p in root.glob("round_*") if p.is_dir())
    for old in rounds[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(path: Path) -> None:
    """Raise ``CheckpointDamaged`` naming the first file that is missing or differs from the manifest."""
    try:
        expected = json.loads((path / MANIFEST).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{path / MANIFEST}: unreadable checksum manifest ({exc})") from None
    for name in FILES:
        if not (path / name).is_file():
            raise CheckpointDamaged(f"{path / name}: missing")
        if _sha256(path / name) != expected.get(name):
            raise CheckpointDamaged(f"{path / name}: checksum mismatch (damaged on disk)")


def load_checkpoint(path: Path) -> dict[str, Any]:
    verify_checkpoint(path)
    arrays = load_file(str(path / "arrays.safetensors"))
    tree: dict[str, Any] = _decode(json.loads((path / "state.json").read_text()), arrays)
    return tree


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Every complete-named checkpoint directory, newest first."""
    return sorted((p for p in (run_dir / "checkpoints").glob("round_*") if p.is_dir()), reverse=True)


def intact_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and why each newer one was passed over."""
    damaged = []
    for path in checkpoint_dirs(run_dir):
        try:
            verify_checkpoint(path)
        except CheckpointDamaged as exc:
            damaged.append(str(exc))
            continue
        return path, damaged
    return None, damaged


def clean_partial(run_dir: Path) -> None:
    """Remove what a killed process left half-written."""
    for tmp in (run_dir / "checkpoints").glob(".tmp_*"):
        shutil.rmtree(tmp, ignore_errors=True)
