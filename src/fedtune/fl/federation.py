"""The Federation contract (how the server talks to clients) and the contexts tasks run in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedtune.data.records import Record
from fedtune.fl.payload import REPLY_TO, Payload
from fedtune.fl.validation import Expect

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig
    from fedtune.resources import Resources


class StepReporter(Protocol):
    def __call__(self, step: int, total: int, loss: float | None) -> None: ...


def no_report(step: int, total: int, loss: float | None) -> None:
    return None


class TaskReporter(Protocol):
    """Opens the progress of one client task: ``client`` runs ``task``, the ``index``-th (from 1) of the
    ``count`` clients one call reaches. The context yields the task's step reporter and exits when the task
    has ended (replied or failed)."""

    def __call__(
        self, client: str, task: str, index: int, count: int
    ) -> AbstractContextManager[StepReporter]: ...


@dataclass
class ClientContext:
    """Everything a client task may use. ``data`` (the client's training records) and ``eval_data``
    (its held-out split, with ``eval.personal``) never leave the client; ``state`` persists;
    ``public`` is the public split every party may read (for methods that compute outputs on it)."""

    client_id: str
    cfg: ExperimentConfig
    data: list[Record]
    resources: Resources
    state: dict[str, Any]
    workdir: Path
    rnd: int = 0
    report: StepReporter = no_report
    eval_data: list[Record] = field(default_factory=list)
    public: list[Record] = field(default_factory=list)


ClientTask = Callable[[ClientContext, Payload], Payload]


def answer(task: ClientTask, ctx: ClientContext, message: Payload) -> Payload:
    """Run ``task`` on ``message`` as a client's runtime does: the task never sees the message's reply tag
    (``payload.REPLY_TO``), and its reply carries it back."""
    tag = message.get(REPLY_TO)
    reply = task(ctx, {key: value for key, value in message.items() if key != REPLY_TO})
    if isinstance(tag, str) and isinstance(reply, dict):
        return {**reply, REPLY_TO: tag}
    return reply


SECRET = "secret:"
"""Client state entries named with this prefix are the client's secrets of one round (SecAgg's private
keys, self-mask seed and held update). They live only in the client's memory: no checkpoint, the server's
or the client's own, ever holds them, and they are forgotten when a later round begins. Each is a dict
with the ``round`` it belongs to."""


def durable_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` without its round secrets: what may be written to a checkpoint."""
    return {key: value for key, value in state.items() if not key.startswith(SECRET)}


def forget_secrets(state: dict[str, Any], keep_round: int | None = None) -> None:
    """Drop ``state``'s round secrets in place, all of them or all but those of ``keep_round``."""
    for key in [k for k in state if k.startswith(SECRET)]:
        entry = state[key]
        if keep_round is None or not isinstance(entry, dict) or entry.get("round") != keep_round:
            del state[key]


@dataclass
class ServerContext:
    cfg: ExperimentConfig
    resources: Resources
    eval_records: list[Record]
    public_records: list[Record]
    run_dir: Path
    client_sizes: dict[str, int] = field(default_factory=dict)
    report: StepReporter = no_report
    validation_records: list[Record] = field(default_factory=list)
    """The training dataset's validation split (for model selection, e.g. FedPT's alpha), if it has one."""
    extra_eval: dict[str, list[Record]] = field(default_factory=dict)
    """More test sets (``eval.extra_datasets``); the runner evaluates each with metric names prefixed."""


@dataclass
class Traffic:
    """Bytes per client in one round; rejected replies still count (they crossed the wire)."""

    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    client_seconds: dict[str, float] = field(default_factory=dict)
    actor_peak_rss_mb: dict[str, float] = field(default_factory=dict)
    """Backends whose clients run in worker processes (Ray): each worker's peak resident memory."""

    def add(self, kind: str, client: str, amount: float) -> None:
        book: dict[str, Any] = getattr(self, kind)
        book[client] = book.get(client, 0) + amount

    @property
    def bytes_down(self) -> int:
        return sum(self.down.values())

    @property
    def bytes_up(self) -> int:
        return sum(self.up.values())


class Federation(Protocol):
    traffic: Traffic

    @property
    def client_sizes(self) -> Mapping[str, int]:
        """The number of training examples the server knows each client holds (empty: it does not know)."""

    def client_ids(self) -> list[str]: ...

    def sample(self, k: int, rnd: int) -> list[str]: ...

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]: ...

    def begin_round(self, rnd: int) -> None: ...


class ServerFederation(Federation, Protocol):
    """What the runner needs of a backend beyond the contract: the round, resumable state."""

    rnd: int

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def seeded_sample(client_ids: list[str], k: int, seed: int, rnd: int) -> list[str]:
    """k distinct clients, a pure function of (seed, round) so that resume samples the same ones."""
    if k >= len(client_ids):
        return list(client_ids)
    rng = np.random.default_rng([seed, rnd, 0x5A])
    chosen = rng.choice(len(client_ids), size=k, replace=False)
    return [client_ids[i] for i in sorted(chosen.tolist())]


def per_client_payload(payload: Payload | Mapping[str, Payload], client: str, clients: list[str]) -> Payload:
    """A broadcast payload, or the client's own entry of a per-client mapping."""
    if payload and set(payload) <= set(clients) and all(isinstance(v, dict) for v in payload.values()):
        own = payload.get(client)
        if not isinstance(own, dict):
            raise KeyError(f"no payload for client {client}")
        return own
    return payload  # type: ignore[return-value]
