"""GridFederation's greeting on a fake Flower grid: which SuperNode serves which client, and how long
the greeting waits for nodes that never answer."""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from fedtune.flower.codec import encode_payload
from fedtune.flower.grid import GridFederation

CLIENTS = ["c00", "c01"]


class FakeGrid:
    """Nodes listed by the SuperLink: ``live`` (node id -> partition) answer every message at once,
    ``gone`` are still listed (heartbeat not yet missed) and never answer."""

    def __init__(self, live: dict[int, int], gone: Iterable[int] = ()) -> None:
        self.live = dict(live)
        self.gone = set(gone)
        self.sent: list[tuple[str, int]] = []

    def get_node_ids(self) -> list[int]:
        return sorted([*self.live, *self.gone])

    def push_messages(self, messages: list[Any]) -> list[str]:
        ids = []
        for message in messages:
            ids.append(f"m{len(self.sent)}")
            self.sent.append((ids[-1], message.metadata.dst_node_id))
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Any]:
        wanted = set(ids)
        return [
            SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=message_id),
                has_error=lambda: False,
                content=encode_payload({}, {"partition-id": self.live[node]}),
            )
            for message_id, node in self.sent
            if message_id in wanted and node in self.live
        ]

    def greeted(self, node: int) -> int:
        return sum(1 for _, to in self.sent if to == node)


def federation(grid: FakeGrid, hello_timeout: float) -> GridFederation:
    fed = GridFederation(grid, CLIENTS, 0, hello_timeout=hello_timeout, poll_interval=0.01)  # type: ignore[arg-type]
    # A real flwr Message needs a Flower run's context; the fake grid reads only the destination.
    fed._message = lambda payload, node, *rest: SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node))  # type: ignore[method-assign]
    return fed


def test_a_vanished_node_does_not_hold_up_the_greeting_once_every_client_is_served() -> None:
    # Node 1 (c01's old SuperNode) was killed; node 3 is its restart. A new ServerApp sees all three.
    grid = FakeGrid({2: 0, 3: 1}, gone=[1])
    fed = federation(grid, hello_timeout=20.0)
    start = time.monotonic()
    assert fed.connected() == CLIENTS
    assert time.monotonic() - start < 5.0  # not the 20 s hello timeout
    assert fed.node_of == {"c00": 2, "c01": 3}
    fed.connected()
    assert grid.greeted(1) == 1  # greeted once, then left out: never waited for again


def test_a_client_without_a_live_node_still_waits_the_hello_timeout() -> None:
    grid = FakeGrid({2: 0}, gone=[1])
    fed = federation(grid, hello_timeout=0.5)
    start = time.monotonic()
    assert fed.connected() == ["c00"]
    assert time.monotonic() - start >= 0.5


def test_a_node_restarted_mid_run_takes_its_clients_place() -> None:
    grid = FakeGrid({2: 0, 3: 1})
    fed = federation(grid, hello_timeout=20.0)
    assert fed.connected() == CLIENTS
    # c01's node vanishes (still listed) and comes back as node 4: the old node still "serves" c01
    # until the SuperLink drops it, so the greeting must wait for node 4's answer, not stop early.
    del grid.live[3]
    grid.gone.add(3)
    grid.live[4] = 1
    assert fed.connected() == CLIENTS
    assert fed.node_of == {"c00": 2, "c01": 4}
