"""Reading a run's status from the SuperLink: a kept-alive connection the SuperLink dropped is asked
again on a fresh one, and a SuperLink that stays away is named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from fedtune.flower import connection as module
from fedtune.flower.connection import FlowerConnection
from fedtune.flower.processes import DeploymentError


class _Client:
    def __init__(self, fails: bool) -> None:
        self.fails, self.closed = fails, False

    def ListNodes(self, request: Any) -> Any:  # the Control API's name
        if self.fails:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return SimpleNamespace(nodes_info=[SimpleNamespace(status="online")] * 2)

    def close(self) -> None:
        self.closed = True


def _connect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fails: list[bool]) -> list[_Client]:
    made: list[_Client] = []

    def control(self: FlowerConnection) -> _Client:
        if self._client is None:
            self._client = _Client(fails[min(len(made), len(fails) - 1)])
            made.append(self._client)
        return self._client  # type: ignore[no-any-return]

    monkeypatch.setattr(FlowerConnection, "_control", control)
    monkeypatch.setattr(module, "ASK_BACKOFF_S", 0.0)
    return made


def test_a_dropped_connection_is_asked_again_on_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made = _connect(monkeypatch, tmp_path, [True, False])
    assert FlowerConnection(tmp_path, "127.0.0.1:9093").online_nodes() == 2
    assert len(made) == 2 and made[0].closed and not made[1].closed


def test_a_superlink_that_stays_away_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made = _connect(monkeypatch, tmp_path, [True])
    with pytest.raises(DeploymentError, match=r"SuperLink at 127\.0\.0\.1:9093 did not answer \(3 tries\)"):
        FlowerConnection(tmp_path, "127.0.0.1:9093").online_nodes()
    assert len(made) == module.ASK_ATTEMPTS and all(client.closed for client in made)
