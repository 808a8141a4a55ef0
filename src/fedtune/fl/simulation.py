"""In-process simulation: clients are called one after another inside the server process.

Base models live once in the shared ``Resources``; each client's trainable state lives in its
own ``state`` dict and is swapped into the shared model by the task itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.data.records import Record
from fedtune.fl.federation import (
    ClientContext,
    ClientTask,
    Traffic,
    durable_state,
    forget_secrets,
    no_report,
)
from fedtune.fl.payload import Payload
from fedtune.fl.replies import (
    ClientHook,
    Outcome,
    ReplyHook,
    RoundKeeper,
    TapHook,
    accept,
    outbound,
    run_task,
    settle,
    unknown_task,
)
from fedtune.fl.validation import Expect, drop_outliers

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig
    from fedtune.fl.federation import StepReporter, TaskReporter
    from fedtune.resources import Resources

__all__ = ["ClientHook", "InProcessFederation", "ReplyHook", "TapHook"]


class InProcessFederation(RoundKeeper):
    """The simulation backend of the Federation contract."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        tasks: Mapping[str, ClientTask],
        client_data: Mapping[str, list[Record]],
        resources: Resources,
        workdir: Path,
        reporter: TaskReporter | None = None,
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

    def begin_round(self, rnd: int) -> None:
        super().begin_round(rnd)
        # A client that dropped mid-protocol never got to clear its round secrets; they are of no use to
        # a later round, and the server process must not keep them.
        for state in self.states.values():
            forget_secrets(state)

    def _context(self, client: str, report: StepReporter) -> ClientContext:
        return ClientContext(
            client_id=client,
            cfg=self.cfg,
            data=self.client_data[client],
            resources=self.resources,
            state=self.states[client],
            workdir=self.workdir / "clients" / client,
            rnd=self.rnd,
            eval_data=self.client_eval.get(client, []),
            public=self.public,
            report=report,
        )

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]:
        if task not in self.tasks:
            raise unknown_task(task, self.tasks)
        replies: dict[str, Payload] = {}
        for index, client in enumerate(clients, 1):
            message, tag = outbound(
                self.traffic, payload, client, clients, self.cfg.fed.wire_dtype, task, self.rnd
            )
            if self.tap is not None:
                self.tap("down", client, task, self.rnd, message)
            reporting = (
                self._reporter(client, task, index, len(clients))
                if self._reporter is not None
                else nullcontext(no_report)
            )
            with reporting as report:
                outcome = self._run_one(client, task, message, report)
            reply = settle(self.traffic, client, task, outcome, timeout, self.rnd)
            if reply is None:
                continue
            if self.tap is not None:
                self.tap("up", client, task, self.rnd, reply)
            accept(self.traffic, replies, client, reply, expect, self.rnd, tag)
        return drop_outliers(replies, expect, self.cfg.fed.screen, self.traffic.rejected, self.rnd)

    def _run_one(self, client: str, task: str, message: Payload, report: StepReporter) -> Outcome:
        ctx = self._context(client, report)
        return run_task(self.tasks[task], ctx, task, message, self.before_task, self.after_task)

    def state_dict(self) -> dict[str, Any]:
        return {"clients": {cid: durable_state(state) for cid, state in self.states.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state.get("clients", {})
        for cid in self.states:
            self.states[cid] = dict(saved.get(cid, {}))
