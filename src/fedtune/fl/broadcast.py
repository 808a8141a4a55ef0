"""Versioned broadcast: large frozen parts travel to a client only when it lacks their current version.

Server side (``VersionedBroadcast``): each part (e.g. FedBiOT's emulator, FedPFT's sub-model) has a
version; a client's message always carries every part's version (``<part>_version``) and the
part's entries only when the server does not know the client to hold that version. Entries are
built once per version, not once per client. A client whose task failed is forgotten (assumed to
hold nothing), and a restarted server knows nobody (it sends again rather than trust a stale record).

Client side (``ClientCache.model``): the client's model is built from the architecture sent with the
part sent once (``ARCH``), then each part is brought to the version the message names
(``receive_part``): load the entries when sent, else check the held version, else reload them from
the client's own disk cache (a restarted client process), else fail loudly: a client must never
train on weights other than the ones the server believes it holds.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays, payload_nbytes, to_wire

ARCH = "arch"
"""The entry carrying the architecture (a model config as JSON) a client builds its model from."""

Loader = Callable[[Any, Mapping[str, np.ndarray], str], None]
"""``load(model, state, what)``: put a part's entries into the client's model (``what``: whence)."""


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

    def forget_unanswered(self, clients: Sequence[str], replied: Container[str]) -> None:
        """Forget each of ``clients`` (sent a message) that is not among those that ``replied``."""
        for client in clients:
            if client not in replied:
                self.forget(client)

    def reset(self) -> None:
        """After a server restart: nobody is known to hold anything, nothing is built."""
        self.held = {}
        self._built = {}


def sent_parts(messages: Iterable[Payload], prefixes: tuple[str, ...], wire_dtype: str) -> tuple[int, int]:
    """How many of ``messages`` carry entries under ``prefixes`` (a part sent), and those entries'
    bytes as sent (fp16 under ``fed.wire_dtype`` fp16)."""
    parts = [{k: v for k, v in m.items() if k.startswith(prefixes)} for m in messages]
    return sum(1 for p in parts if p), sum(payload_nbytes(to_wire(p, wire_dtype)) for p in parts)


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


@dataclass
class ClientCache:
    """What one client process holds of a broadcast model: in memory (``held``: the model, what it
    was built from, each part's version) and, with a ``directory``, on the client's disk too."""

    client: str
    held: dict[str, Any]
    directory: Path | None = None

    @classmethod
    def of(cls, ctx: ClientContext, method: str) -> ClientCache:
        """``method``'s cache in ``ctx``'s process; on disk under ``<workdir>/<method>-cache`` when the
        method's section sets ``client_cache`` (resolved by ``client_cache_mode``) to ``disk``."""
        section = ctx.cfg.section(method)
        mode = client_cache_mode(str(section.client_cache), getattr(ctx.cfg.fed, "backend", "simulation"))
        directory = ctx.workdir / f"{method}-cache" if mode == "disk" else None
        return cls(ctx.client_id, ctx.resources.get(f"{method}/client", dict), directory)

    def model(
        self,
        msg: Payload,
        build: Callable[[str], Any],
        parts: Mapping[str, tuple[str, Loader]],
        *,
        key: object = None,
        what: str = "model",
    ) -> Any:
        """The client's model, its ``parts`` at the versions ``msg`` names.

        ``build(architecture)`` makes the model from the JSON that ``msg[ARCH]`` carries (sent with the
        part sent once); it is built again only when the architecture or ``key`` (what else the model
        is built from, e.g. a layout) changes. ``parts``: part -> (payload prefix, ``load``); a part
        whose version ``msg`` does not carry is left as it is. Raises ``ClientCacheMiss`` when the
        process holds no model and was sent no architecture (``what`` names the model).
        """
        arch = self._architecture(msg)
        if arch is not None and self.held.get("key") != (arch, key):
            self.held.clear()
            self.held.update(key=(arch, key), model=build(arch), versions={})
        if "model" not in self.held:
            raise ClientCacheMiss(f"client {self.client} holds no {what} and was not sent one")
        model = self.held["model"]
        for part, (prefix, load) in parts.items():
            if version_key(part) in msg:
                cache_file = None if self.directory is None else self.directory / f"{part}.npz"
                load_part = functools.partial(load, model)
                receive_part(
                    msg,
                    part,
                    prefix,
                    self.held["versions"],
                    load_part,
                    cache_file=cache_file,
                    client=self.client,
                )
        return model

    def _architecture(self, msg: Payload) -> str | None:
        """The architecture ``msg`` carries (kept on disk), else, for a process that holds no model
        (restarted), the one on its disk; None when neither."""
        arch_file = None if self.directory is None else self.directory / "arch.json"
        arch = msg.get(ARCH)
        if arch is not None:
            if arch_file is not None:
                arch_file.parent.mkdir(parents=True, exist_ok=True)
                arch_file.write_text(str(arch))
            return str(arch)
        if "model" not in self.held and arch_file is not None and arch_file.is_file():
            return arch_file.read_text()
        return None
