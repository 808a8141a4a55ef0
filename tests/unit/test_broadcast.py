"""The versioned broadcast: a part travels only to clients that lack its current version."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedtune.fl.broadcast import (
    ARCH,
    ClientCache,
    ClientCacheMiss,
    Loader,
    VersionedBroadcast,
    receive_part,
    sent_parts,
)
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


def test_forget_unanswered_forgets_only_the_silent() -> None:
    cast = VersionedBroadcast(("big",))
    cast.set_version("big", 1)
    cast.delivered(["a", "b"])

    cast.forget_unanswered(["a", "b"], {"b": {}})

    assert cast.held == {"b": {"big": 1}}


class Model:
    """A client model: the architecture it was built from and what each part loaded into it."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.parts: dict[str, tuple[float, str]] = {}


def load_into(part: str) -> Loader:
    def load(model: Model, state: Mapping[str, np.ndarray], what: str) -> None:
        model.parts[part] = (float(state["w"][0]), what)

    return load


PARTS = {"frozen": ("frozen/", load_into("frozen")), "ffn": ("ffn/", load_into("ffn"))}


def first_contact(ffn: float = 2.0) -> Payload:
    return {
        ARCH: '{"width": 4}',
        "frozen_version": 1,
        "frozen/w": np.full(2, 1.0, np.float32),
        "ffn_version": 1,
        "ffn/w": np.full(2, ffn, np.float32),
    }


def test_client_model_is_built_once_from_the_architecture_it_was_sent() -> None:
    built: list[str] = []
    cache = ClientCache("c0", {})

    def build(arch: str) -> Model:
        built.append(arch)
        return Model(arch)

    model = cache.model(first_contact(), build, PARTS, key="layout-1")
    again = cache.model({"frozen_version": 1, "ffn_version": 1}, build, PARTS, key="layout-1")

    assert again is model and built == ['{"width": 4}']
    assert model.parts == {
        "frozen": (1.0, "frozen weights from the server"),
        "ffn": (2.0, "ffn weights from the server"),
    }
    assert cache.model(first_contact(), build, PARTS, key="layout-2") is not model  # another layout
    assert len(built) == 2


def test_a_part_without_its_version_in_the_message_is_left_alone() -> None:
    cache = ClientCache("c0", {})
    model = cache.model(first_contact(), Model, PARTS)

    cache.model({ARCH: '{"width": 4}', "frozen_version": 1}, Model, PARTS)

    assert model.parts["ffn"][0] == 2.0 and cache.held["versions"] == {"frozen": 1, "ffn": 1}


def test_a_restarted_client_rebuilds_its_model_from_its_disk(tmp_path: Path) -> None:
    ClientCache("c0", {}, tmp_path).model(first_contact(ffn=3.0), Model, PARTS, what="sub-model")

    restarted = ClientCache("c0", {}, tmp_path)
    model = restarted.model({"frozen_version": 1, "ffn_version": 1}, Model, PARTS, what="sub-model")

    assert model.arch == '{"width": 4}' and model.parts["ffn"] == (3.0, str(tmp_path / "ffn.npz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arch.json", "ffn.npz", "frozen.npz"]


def test_a_client_holding_nothing_and_sent_nothing_fails_loudly() -> None:
    with pytest.raises(ClientCacheMiss, match="client c0 holds no sub-model and was not sent one"):
        ClientCache("c0", {}).model({"frozen_version": 1}, Model, PARTS, what="sub-model")


def test_sent_parts_counts_the_messages_carrying_a_part_and_its_bytes() -> None:
    messages: list[Payload] = [
        {"big_version": 1, "big/w": np.ones(4, np.float32), "small/w": np.ones(2, np.float32)},
        {"big_version": 1, "small/w": np.ones(2, np.float32)},
        {"big_version": 1},
    ]

    # Bytes: the arrays' and the keys' ("big/w" 5, "small/w" 7).
    assert sent_parts(messages, ("big/",), "fp32") == (1, 16 + 5)
    assert sent_parts(messages, ("big/", "small/"), "fp32") == (2, (16 + 5) + 2 * (8 + 7))


@pytest.mark.parametrize(
    ("client_cache", "backend", "on_disk"),
    [
        ("auto", "flower", True),
        ("auto", "simulation", False),
        ("disk", "simulation", True),
        ("memory", "flower", False),
    ],
)
def test_a_methods_client_cache_lives_in_its_process_and_on_disk_as_configured(
    tmp_path: Path, client_cache: str, backend: str, on_disk: bool
) -> None:
    store: dict[str, object] = {}
    cfg = SimpleNamespace(
        section=lambda name: SimpleNamespace(client_cache=client_cache) if name == "fedpft" else None,
        fed=SimpleNamespace(backend=backend),
    )
    resources = SimpleNamespace(get=lambda key, build: store.setdefault(key, build()))
    ctx = SimpleNamespace(client_id="c0", cfg=cfg, resources=resources, workdir=tmp_path)

    cache = ClientCache.of(ctx, "fedpft")

    assert cache.directory == (tmp_path / "fedpft-cache" if on_disk else None)
    assert cache.held is store["fedpft/client"] and ClientCache.of(ctx, "fedpft").held is cache.held
