"""The versioned broadcast: a part travels only to clients that lack its current version."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from fedtune.fl.broadcast import ClientCacheMiss, VersionedBroadcast, receive_part
from fedtune.fl.payload import Payload


def test_parts_go_once_per_version_and_are_built_once() -> None:
    built: list[str] = []

    def build(part: str) -> Payload:
        built.append(part)
        return {f"{part}/w": np.ones(3, np.float32)}

    cast = VersionedBroadcast(("big",))
    cast.set_version("big", 1)
    first = cast.message("a", build)
    assert first["big_version"] == 1 and "big/w" in first
    assert "big/w" in cast.message("b", build) and built == ["big"]  # built once for both clients
    cast.delivered(["a", "b"])
    assert "big/w" not in cast.message("a", build) and cast.message("a", build)["big_version"] == 1
    cast.set_version("big", 2)
    assert "big/w" in cast.message("a", build) and built == ["big", "big"]
    cast.delivered(["a"])
    cast.forget("a")  # its task failed: assume it holds nothing
    assert "big/w" in cast.message("a", build)
    cast.delivered(["a"])
    cast.reset()
    assert "big/w" in cast.message("a", build)


def test_receive_part_from_message_memory_disk_or_fail(tmp_path: Path) -> None:
    loaded: list[tuple[float, str]] = []

    def load(state: Mapping[str, np.ndarray], what: str) -> None:
        loaded.append((float(state["w"][0]), what))

    held: dict[str, int] = {}
    cache = tmp_path / "big.npz"
    sent = {"big_version": 3, "big/w": np.full(2, 7.0, np.float32)}
    receive_part(sent, "big", "big/", held, load, cache_file=cache, client="c0")
    assert held == {"big": 3} and loaded[-1][0] == 7.0
    receive_part({"big_version": 3}, "big", "big/", held, load, cache_file=cache, client="c0")
    assert len(loaded) == 1  # held in memory: nothing to load
    receive_part({"big_version": 3}, "big", "big/", {}, load, cache_file=cache, client="c0")
    assert loaded[-1] == (7.0, str(cache))  # a restarted process: from its disk
    with pytest.raises(ClientCacheMiss, match="does not hold big version 4"):
        receive_part({"big_version": 4}, "big", "big/", {}, load, cache_file=cache, client="c0")
    with pytest.raises(ClientCacheMiss):
        receive_part({"big_version": 3}, "big", "big/", {}, load, cache_file=None, client="c0")
