"""Every reply answers one message: a reply re-sent from an earlier round (or call) is rejected, and so is
an evaluation reply that names another round; the client runtime returns the message's tag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedtune.fl.payload import REPLY_TO, Payload
from tests.integration.helpers import quiet_runner, tiny_config

TWO_ROUNDS = ("fed.rounds=2", "eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4")


class Replayer:
    """Keeps every round-1 reply of ``task``; in round 2 sends one client's round-1 reply again."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.kept: dict[str, Payload] = {}
        self.replayed: str | None = None

    def __call__(self, client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if task != self.task:
            return reply
        if rnd == 1:
            self.kept[client] = dict(reply)
        elif rnd == 2 and self.replayed is None and client in self.kept:
            self.replayed = client
            return self.kept[client]
        return reply


@pytest.mark.parametrize("algorithm", ["fedit", "perfit", "fedpt", "fedbiot", "fedpft"])
def test_an_update_replayed_from_round_1_is_rejected_in_round_2(algorithm: str, tmp_path: Path) -> None:
    replay = Replayer("fit")
    history = quiet_runner(tiny_config(algorithm, *TWO_ROUNDS), tmp_path / "run", after_task=replay).run()
    client = replay.replayed
    assert client is not None
    reason = history[2]["rejected"].get(client, "")
    assert "answers fit of round 1, not this call's fit of round 2" in reason, history[2]["rejected"]


@pytest.mark.parametrize("algorithm", ["perfit", "fedmkt"])
def test_a_personal_evaluation_of_another_round_is_rejected(algorithm: str, tmp_path: Path) -> None:
    # Prepare: c00's evaluation reply claims round 999 in round 1; in round 2 another client re-sends its
    # round-1 evaluation reply.
    replay = Replayer("evaluate_personal")

    def tamper(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if task == "evaluate_personal" and rnd == 1 and client == "c00":
            return {**reply, "round": 999}
        return replay(client, task, rnd, reply)

    # Execute
    runner = quiet_runner(tiny_config(algorithm, *TWO_ROUNDS), tmp_path / "run", after_task=tamper)
    history = runner.run()

    # Assert: both are rejected in the round's row, with the reason
    assert history[1]["rejected"]["c00"] == "the reply says it is of round 999, and this is round 1"
    client = replay.replayed
    assert client is not None
    assert history[2]["rejected"][client].startswith(
        "the reply answers evaluate_personal of round 1, not this call's evaluate_personal of round 2"
    )


def test_the_client_runtime_hides_the_tag_from_the_task_and_returns_it() -> None:
    from fedtune.fl.federation import ClientContext, answer

    seen: list[Payload] = []

    def task(ctx: ClientContext, msg: Payload) -> Payload:
        seen.append(msg)
        return {"num_examples": 3}

    reply = answer(task, None, {"round": 2, REPLY_TO: "fit@2#00ff"})  # type: ignore[arg-type]
    assert seen == [{"round": 2}] and reply == {"num_examples": 3, REPLY_TO: "fit@2#00ff"}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (
            "metric/perplexity",
            1e300,
            r"'metric/perplexity' = 1e\+300 is outside what it can be \(\[1, 1e\+06\]\)",
        ),
        ("metric/perplexity", 0.5, r"'metric/perplexity' = 0\.5 is outside"),
    ],
)
def test_a_self_reported_metric_beyond_what_it_can_be_is_rejected(
    key: str, value: float, why: str, tmp_path: Path
) -> None:
    def inflate(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if task == "evaluate_personal" and client == "c00":
            return {**reply, key: value}
        return reply

    history = quiet_runner(tiny_config("perfit", *TWO_ROUNDS), tmp_path / "run", after_task=inflate).run()
    assert re.search(why, history[1]["rejected"]["c00"])
    assert history[1]["eval"]["personal/perplexity"] < 1e4  # the honest clients' mean
