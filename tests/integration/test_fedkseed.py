"""FedKSeed end to end on the tiny config: what crosses the wire, what the server refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.fl.payload import Payload
from tests.integration.helpers import quiet_runner, stable, tiny_config

FAST = ("eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4")


def test_a_reply_with_a_seed_not_of_the_round_is_rejected_naming_the_seed(tmp_path: Path) -> None:
    def swap_seed(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == "c01" and rnd == 1:
            seeds = np.array(reply["seeds"], copy=True)
            seeds[2] = 99
            return {**reply, "seeds": seeds}
        return reply

    history = quiet_runner(
        tiny_config("fedkseed", "fed.rounds=1", *FAST), tmp_path, after_task=swap_seed
    ).run()

    assert history[1]["rejected"] == {
        "c01": "fedkseed: seed 99 at position 2 is not a seed of this round (expected 1195884381)"
    }


def test_sending_the_model_instead_of_the_history_gives_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the same run twice, the second told that the model is always the cheaper catch-up
    cfg = tiny_config("fedkseed", "fed.rounds=3", "fed.clients_per_round=2", *FAST)
    by_history = quiet_runner(cfg, tmp_path / "history").run()
    sent: list[set[str]] = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        if direction == "down":
            sent.append({key.split("/")[0] for key in payload})

    monkeypatch.setattr("fedtune.algorithms.fedkseed.server.history_is_cheaper", lambda *args: False)

    # Execute
    by_model = quiet_runner(cfg, tmp_path / "model", tap=tap).run()

    # Assert: clients that lacked rounds got the model's arrays and trained from the same bits
    assert any("model" in keys for keys in sent)
    assert sum(row.get("bytes_down", 0) for row in by_model) > sum(
        row.get("bytes_down", 0) for row in by_history
    )
    drop = ("bytes_down",)
    assert [{k: v for k, v in row.items() if k not in drop} for row in stable(by_model)] == [
        {k: v for k, v in row.items() if k not in drop} for row in stable(by_history)
    ]
