"""Versioned broadcast: large frozen parts travel to a client only when it lacks their current version.

Server side (``VersionedBroadcast``): each part (e.g. FedBiOT's emulator, FedPFT's sub-model) has a
version; a client's message always carries every part's version (``<part>_version``) and the
part's entries only when the server does not know the client to hold that version. Entries are
built once per version, not once per client. A client whose task failed is forgotten (assumed to
hold nothing), and a restarted server knows nobody (it sends again rather than trust a stale record).

Client side (``receive_part``): load the entries when sent, else check the held version, else
reload them from the client's own disk cache (a restarted client process), else fail loudly: a
client must never train on weights other than the ones the server believes it holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fedtune.fl.payload import Payload, arrays


class ClientCacheMiss(RuntimeError):
    """The server assumed the client holds weights that it does not (a restarted client process)."""


def version_key(part: str) -> str:
    return f"{part}_version"


class VersionedBroadcast:
    """Which version of each part every client holds, and the parts' payload entries per version."""

    def __init__(self, parts: Sequence[str]) -> None:
        self.versions = dict.fromkeys(parts, 0)
        self.held: dict[str, dict[str, int]] = {}
        self._built: dict[str, tuple[int, Payload]] = {}

    def set_version(self, part: str, version: int) -> None:
        self.versions[part] = version

    def message(self, client: str, build: Callable[[str], Payload]) -> Payload:
        """``client``'s message: every part's version, and ``build(part)``'s entries where it lacks it."""
        held = self.held.get(client, {})
        message: Payload = {version_key(part): version for part, version in self.versions.items()}
        for part, version in self.versions.items():
            if held.get(part) != version:
                message.update(self._entries(part, version, build))
        return message

    def _entries(self, part: str, version: int, build: Callable[[str], Payload]) -> Payload:
        cached = self._built.get(part)
        if cached is None or cached[0] != version:
            cached = (version, build(part))  # older versions go
            self._built[part] = cached
        return cached[1]

    def delivered(self, clients: Sequence[str]) -> None:
        for client in clients:
            self.held[client] = dict(self.versions)

    def forget(self, client: str) -> None:
        """``client`` failed or was rejected: assume it holds nothing."""
        self.held.pop(client, None)

    def reset(self) -> None:
        """After a server restart: nobody is known to hold anything, nothing is built."""
        self.held = {}
        self._built = {}


def client_cache_mode(mode: str, backend: str) -> str:
    """Where a client keeps what it was sent: ``auto`` = ``disk`` on Flower (a ClientApp process lives
    for one message), ``memory`` in simulation."""
    if mode == "auto":
        return "disk" if backend == "flower" else "memory"
    return mode


def save_npz(path: Path, state: Mapping[str, np.ndarray]) -> None:
    """Write ``state`` atomically (per process: runs and clients sharing a directory may race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **dict(state))  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
    os.replace(tmp, path)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def receive_part(
    msg: Payload,
    part: str,
    prefix: str,
    held: dict[str, int],
    load: Callable[[Mapping[str, np.ndarray], str], None],
    *,
    cache_file: Path | None,
    client: str,
) -> None:
    """Bring the client's copy of ``part`` to the version ``msg`` names.

    ``held`` maps part -> version the client's process holds (updated here); ``load(state, what)``
    puts entries into the client's model; ``cache_file`` (None: memory only) keeps the last version
    received on the client's disk. Raises ``ClientCacheMiss`` when the version is nowhere.
    """
    version = int(msg[version_key(part)])
    state = arrays(msg, prefix)
    if state:
        load(state, f"{part} weights from the server")
        held[part] = version
        if cache_file is not None:
            save_npz(cache_file, {**state, "__version__": np.asarray(version)})
        return
    if held.get(part) == version:
        return
    if cache_file is not None and cache_file.is_file():
        saved = load_npz(cache_file)
        if int(saved.pop("__version__")) == version:
            load(saved, str(cache_file))
            held[part] = version
            return
    raise ClientCacheMiss(f"client {client} does not hold {part} version {version} and was not sent it")
