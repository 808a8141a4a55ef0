"""In-process simulation: clients are called one after another inside the server process.

Base models live once in the shared ``Resources``; each client's trainable state lives in its
own ``state`` dict and is swapped into the shared model by the task itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.data.records import Record
from fedtune.fl.federation import (
    ClientContext,
    ClientTask,
    Traffic,
    answer,
    durable_state,
    forget_secrets,
    per_client_payload,
    seeded_sample,
)
from fedtune.fl.payload import Payload, PayloadError, check_payload, from_wire, payload_nbytes, to_wire
from fedtune.fl.validation import Expect, ReplyRejected, addressed, check_answers, check_reply, drop_outliers

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig
    from fedtune.fl.federation import StepReporter
    from fedtune.resources import Resources

log = logging.getLogger("fedtune.fl")

ClientHook = Callable[[str, str, int], None]
ReplyHook = Callable[[str, str, int, Payload], Payload]
TapHook = Callable[[str, str, str, int, Payload], None]
"""``(direction "down" | "up", client, task, round, payload)``: sees every message on the wire."""


class InProcessFederation:
    """The simulation backend of the Federation contract."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        tasks: Mapping[str, ClientTask],
        client_data: Mapping[str, list[Record]],
        resources: Resources,
        workdir: Path,
        reporter: Callable[[str], StepReporter] | None = None,
        before_task: ClientHook | None = None,
        after_task: ReplyHook | None = None,
        tap: TapHook | None = None,
        client_eval: Mapping[str, list[Record]] | None = None,
        public: list[Record] | None = None,
    ) -> None:
        self.cfg = cfg
        self.client_eval = dict(client_eval or {})
        self.public = list(public or [])
        self.tasks = dict(tasks)
        self.client_data = dict(client_data)
        self.resources = resources
        self.workdir = workdir
        self.states: dict[str, dict[str, Any]] = {cid: {} for cid in client_data}
        self.client_sizes = {cid: len(records) for cid, records in client_data.items()}
        self.traffic = Traffic()
        self.rnd = 0
        self._reporter = reporter
        # Test hooks: raising from before_task simulates a crashed client; after_task sees (and may
        # tamper with) every reply before it crosses the wire.
        self.before_task = before_task
        self.after_task = after_task
        self.tap = tap

    def client_ids(self) -> list[str]:
        return list(self.client_data)

    def sample(self, k: int, rnd: int) -> list[str]:
        return seeded_sample(self.client_ids(), k, self.cfg.seed, rnd)

    def begin_round(self, rnd: int) -> None:
        self.rnd = rnd
        self.traffic = Traffic()
        # A client that dropped mid-protocol never got to clear its round secrets; they are of no use to
        # a later round, and the server process must not keep them.
        for state in self.states.values():
            forget_secrets(state)

    def _context(self, client: str) -> ClientContext:
        report = self._reporter(client) if self._reporter else None
        ctx = ClientContext(
            client_id=client,
            cfg=self.cfg,
            data=self.client_data[client],
            resources=self.resources,
            state=self.states[client],
            workdir=self.workdir / "clients" / client,
            rnd=self.rnd,
            eval_data=self.client_eval.get(client, []),
            public=self.public,
        )
        if report is not None:
            ctx.report = report
        return ctx

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]:
        if task not in self.tasks:
            raise KeyError(f"unknown client task {task!r}; registered: {sorted(self.tasks)}")
        replies: dict[str, Payload] = {}
        wire_dtype = self.cfg.fed.wire_dtype
        for client in clients:
            message, tag = addressed(
                to_wire(per_client_payload(payload, client, clients), wire_dtype), task, self.rnd
            )
            self.traffic.add("down", client, payload_nbytes(message))
            if self.tap is not None:
                self.tap("down", client, task, self.rnd, message)
            reply = self._run_one(client, task, from_wire(message), timeout)
            if reply is None:
                continue
            self.traffic.add("up", client, payload_nbytes(reply))
            if self.tap is not None:
                self.tap("up", client, task, self.rnd, reply)
            try:
                replies[client] = check_reply(check_answers(from_wire(reply), tag, self.rnd), expect, client)
            except ReplyRejected as exc:
                self.traffic.rejected[client] = str(exc)
                log.warning("round %d: rejected the reply of client %s: %s", self.rnd, client, exc)
        return drop_outliers(replies, expect, self.cfg.fed.screen, self.traffic.rejected, self.rnd)

    def _run_one(self, client: str, task: str, message: Payload, timeout: float | None) -> Payload | None:
        start = time.perf_counter()
        try:
            if self.before_task is not None:
                self.before_task(client, task, self.rnd)
            reply = answer(self.tasks[task], self._context(client), message)
            if self.after_task is not None:
                reply = self.after_task(client, task, self.rnd, reply)
            reply = to_wire(check_payload(reply, f"client {client}"), self.cfg.fed.wire_dtype)
        except PayloadError as exc:
            self.traffic.rejected[client] = str(exc)
            log.warning("round %d: client %s sent a malformed reply: %s", self.rnd, client, exc)
            return None
        except Exception as exc:
            self.traffic.failed[client] = f"{type(exc).__name__}: {exc}"
            log.warning("round %d: client %s failed in task %s: %s", self.rnd, client, task, exc)
            return None
        finally:
            self.traffic.add("client_seconds", client, time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        if timeout is not None and elapsed > timeout:
            self.traffic.failed[client] = f"late: {elapsed:.1f}s > timeout {timeout:.1f}s"
            return None
        return reply

    def state_dict(self) -> dict[str, Any]:
        return {"clients": {cid: durable_state(state) for cid, state in self.states.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state.get("clients", {})
        for cid in self.states:
            self.states[cid] = dict(saved.get(cid, {}))
