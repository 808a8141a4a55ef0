"""One client task from message to accepted reply, shared by the backends that run tasks themselves.

The simulation runs a task in the server's process, the Ray backend in an actor; both must count the
same bytes, record the same failures and reject the same replies, so both go through these steps:

- ``outbound``: the message a client is sent (its own entry of a per-client payload, in the wire
  dtype), its bytes counted ``down``;
- ``run_task``: the task itself, where the client runs it, with the test hooks; a malformed reply or
  an exception becomes an ``Outcome`` that says why (nothing raises past it);
- ``settle``: the outcome's seconds, failure or lateness recorded in ``Traffic``;
- ``accept``: the reply's bytes counted ``up``, ``check_reply`` applied; ``drop_outliers`` then screens
  the call's accepted replies together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedtune.fl.federation import (
    ClientContext,
    ClientTask,
    Traffic,
    answer,
    per_client_payload,
    seeded_sample,
)
from fedtune.fl.payload import Payload, PayloadError, check_payload, from_wire, payload_nbytes, to_wire
from fedtune.fl.validation import Expect, ReplyRejected, addressed, check_answers, check_reply

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig

log = logging.getLogger("fedtune.fl")

ClientHook = Callable[[str, str, int], None]
ReplyHook = Callable[[str, str, int, Payload], Payload]
TapHook = Callable[[str, str, str, int, Payload], None]
"""``(direction "down" | "up", client, task, round, payload)``: sees every message on the wire."""


class RoundKeeper:
    """The part of the contract a backend that knows its clients' sizes needs no more for: the client
    list, the seeded sample (a pure function of seed and round, so a resume samples the same clients)
    and a fresh ``Traffic`` per round."""

    cfg: ExperimentConfig
    client_sizes: dict[str, int]
    traffic: Traffic
    rnd: int

    def client_ids(self) -> list[str]:
        return list(self.client_sizes)

    def sample(self, k: int, rnd: int) -> list[str]:
        return seeded_sample(self.client_ids(), k, self.cfg.seed, rnd)

    def begin_round(self, rnd: int) -> None:
        self.rnd = rnd
        self.traffic = Traffic()


@dataclass
class Outcome:
    """A task's result where it ran: the wire reply, or why there is none (``malformed``: the reply
    itself was bad, a rejection; otherwise the task failed), and the seconds it took."""

    reply: Payload | None
    error: str | None
    malformed: bool
    seconds: float


def outbound(
    traffic: Traffic,
    payload: Payload | Mapping[str, Payload],
    client: str,
    clients: list[str],
    wire_dtype: str,
    task: str,
    rnd: int,
) -> tuple[Payload, str]:
    """The wire message ``client`` is sent for ``task`` in round ``rnd``, with its reply tag, its bytes
    counted down; and the tag its reply must carry (``validation.addressed``)."""
    message, tag = addressed(to_wire(per_client_payload(payload, client, clients), wire_dtype), task, rnd)
    traffic.add("down", client, payload_nbytes(message))
    return message, tag


def run_task(
    task: ClientTask,
    ctx: ClientContext,
    task_name: str,
    message: Payload,
    before: ClientHook | None = None,
    after: ReplyHook | None = None,
) -> Outcome:
    """Run ``task`` on the wire ``message``; the reply checked and put in the wire dtype.

    Catches every ``Exception``: a client's crash must cost the round one reply, not the run.
    """
    start = time.perf_counter()
    client = ctx.client_id
    try:
        if before is not None:
            before(client, task_name, ctx.rnd)
        reply = answer(task, ctx, from_wire(message))
        if after is not None:
            reply = after(client, task_name, ctx.rnd, reply)
        reply = to_wire(check_payload(reply, f"client {client}"), ctx.cfg.fed.wire_dtype)
    except PayloadError as exc:
        return Outcome(None, str(exc), True, time.perf_counter() - start)
    except Exception as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}", False, time.perf_counter() - start)
    return Outcome(reply, None, False, time.perf_counter() - start)


def settle(
    traffic: Traffic, client: str, task: str, outcome: Outcome, timeout: float | None, rnd: int
) -> Payload | None:
    """Record the outcome's seconds and any failure; the reply if it came in time, else None."""
    traffic.add("client_seconds", client, outcome.seconds)
    if outcome.reply is None:
        fail(traffic, client, task, outcome.error or "no reply", rnd, malformed=outcome.malformed)
        return None
    if timeout is not None and outcome.seconds > timeout:
        traffic.failed[client] = f"late: {outcome.seconds:.1f}s > timeout {timeout:.1f}s"
        return None
    return outcome.reply


def fail(traffic: Traffic, client: str, task: str, reason: str, rnd: int, malformed: bool = False) -> None:
    """A client that sent a malformed reply (``rejected``) or none at all (``failed``), with the reason."""
    if malformed:
        traffic.rejected[client] = reason
        log.warning("round %d: client %s sent a malformed reply: %s", rnd, client, reason)
    else:
        traffic.failed[client] = reason
        log.warning("round %d: client %s failed in task %s: %s", rnd, client, task, reason)


def accept(
    traffic: Traffic,
    replies: dict[str, Payload],
    client: str,
    reply: Payload,
    expect: Expect | None,
    rnd: int,
    tag: str,
) -> None:
    """Count the reply's bytes up and keep it in ``replies`` if it answers the message tagged ``tag``
    (``check_answers``) and ``check_reply`` passes it."""
    traffic.add("up", client, payload_nbytes(reply))
    try:
        replies[client] = check_reply(check_answers(from_wire(reply), tag, rnd), expect, client)
    except ReplyRejected as exc:
        traffic.rejected[client] = str(exc)
        log.warning("round %d: rejected the reply of client %s: %s", rnd, client, exc)


def unknown_task(task: str, tasks: Iterable[str]) -> KeyError:
    return KeyError(f"unknown client task {task!r}; registered: {sorted(tasks)}")
