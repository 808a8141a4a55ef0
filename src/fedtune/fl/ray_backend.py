"""The Ray backend (``fed.backend: ray``): the clients' tasks run in a pool of persistent Ray actors.

Why actors and not the simulation: one process trains one client at a time on one device. Here
``ray.actors`` processes (on one machine's GPUs, or a cluster's machines) each hold the base models
once, the data of the clients assigned to them (client ``i`` -> actor ``i % actors``, stable) and
those clients' state, so a round's tasks for clients on different actors run at the same time.

Each actor rebuilds the run from the resolved config YAML, as a Flower node does: the same seeded
partitions, the same models, the same task functions; only messages, replies and client state cross
process boundaries. Bytes, failures and rejections are booked by ``fedtune.fl.replies``, the steps the
simulation uses too, so a run's metrics match the in-process run's.

Ray is imported only here, on first use; it is the ``ray`` extra (``pip install 'fedtune[ray]'``).
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.errors import RunError
from fedtune.fl.federation import ClientContext, ClientTask, Traffic, durable_state, forget_secrets
from fedtune.fl.payload import Payload
from fedtune.fl.replies import (
    ClientHook,
    Outcome,
    ReplyHook,
    RoundKeeper,
    TapHook,
    accept,
    fail,
    outbound,
    run_task,
    settle,
    unknown_task,
)
from fedtune.fl.validation import Expect, drop_outliers

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig, RayConfig
    from fedtune.data.records import Record

log = logging.getLogger("fedtune.fl")

TaskBuilder = Callable[["ExperimentConfig"], Mapping[str, ClientTask]]
"""Builds the client tasks from the config inside an actor (``fedtune.algorithms.registry.client_tasks``;
passed in, since the federation layer does not import the algorithms)."""

RAY_EXTRA = "pip install 'fedtune[ray]'"
CONNECT_TIMEOUT_S = 5.0
"""How long ``ray.address`` may take to accept a TCP connection before the run stops: a typo'd or
down head node must fail in seconds, not after Ray's own minute-long retries."""
START_TIMEOUT_S = 900.0
"""How long the actors may take to start and load their data (a cluster may first add machines)."""


class RayMissing(RunError):
    """``fed.backend: ray`` without Ray installed."""


def import_ray() -> Any:
    """The ``ray`` module, or an error that names the extra to install."""
    try:
        import ray
    except ImportError:
        raise RayMissing(f"fed.backend: ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``ray.address`` where nothing accepts a connection, naming it, within ``timeout``."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise RunError(f"ray.address {address!r}: expected host:port (e.g. 10.0.0.5:6379) or 'auto'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise RunError(
            f"ray.address {address!r}: no Ray head answers there ({exc}); start one with "
            "`ray start --head` on that machine, or set ray.address: null for a local instance"
        ) from None


def connect(ray_cfg: RayConfig, actors: int) -> Any:
    """Ray, connected: to ``ray.address``, to an instance this process already holds, or to a new
    local one sized to the actors (no dashboard, workers' output kept off the console)."""
    ray = import_ray()
    address = ray_cfg.address
    if address not in (None, "auto"):
        check_reachable(address)
    if ray.is_initialized():
        return ray
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    try:
        if address is None:
            ray.init(num_cpus=max(1, math.ceil(actors * ray_cfg.num_cpus)), **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError) as exc:
        raise RunError(f"ray.address {address!r}: could not join the Ray instance there: {exc}") from None
    return ray


def check_capacity(ray: Any, ray_cfg: RayConfig, actors: int) -> None:
    """Refuse a pool the instance cannot hold at once: every actor must be up before the first round,
    and Ray would keep the ones that do not fit waiting, forever. (An autoscaling cluster that would
    add machines on demand is not waited for.)"""
    total = ray.cluster_resources()
    for key, resource in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = actors * float(getattr(ray_cfg, key))
        have = float(total.get(resource, 0.0))
        if need > have + 1e-9:
            raise RunError(
                f"ray.actors {actors} x ray.{key} {getattr(ray_cfg, key):g} = {need:g} {resource}s, but the "
                f"Ray instance has {have:g}; lower ray.actors or ray.{key}, or add machines to the cluster"
            )


class ClientActor:
    """One actor of the pool (made a Ray actor class by ``RayFederation``): the run rebuilt from its
    config, the data and state of the clients it serves, and its own ``Resources`` (models loaded once,
    on the first task that needs them)."""

    def __init__(
        self,
        config_yaml: str,
        index: int,
        actors: int,
        workdir: str,
        build_tasks: TaskBuilder,
        hooks: tuple[ClientHook | None, ReplyHook | None] = (None, None),
    ) -> None:
        import torch
        import yaml

        from fedtune.config import validate_config
        from fedtune.resources import Resources
        from fedtune.rundata import prepare_data

        cfg = validate_config(yaml.safe_load(config_yaml), source="run config")
        torch.set_num_threads(max(1, int(cfg.ray.num_cpus)))
        run_data = prepare_data(cfg)
        mine = [cid for i, cid in enumerate(run_data.clients) if i % actors == index]
        self.cfg = cfg
        self.data: dict[str, list[Record]] = {cid: run_data.clients[cid] for cid in mine}
        self.eval_data = {cid: run_data.client_eval.get(cid, []) for cid in mine}
        self.public = run_data.public_records
        self.resources = Resources(cfg)
        self.tasks = build_tasks(cfg)
        self.states: dict[str, dict[str, Any]] = {cid: {} for cid in mine}
        self.workdir = Path(workdir)
        self.hooks = hooks

    def ready(self) -> list[str]:
        """The clients this actor serves (the driver waits on this: the actor is built)."""
        return list(self.data)

    def execute(self, client: str, task: str, rnd: int, message: Payload) -> tuple[Outcome, float]:
        """Run one task with the client's state swapped in; the outcome and this process's peak RSS."""
        from fedtune.train.loop import peak_rss_mb

        forget_secrets(self.states[client], keep_round=rnd)  # a round this client dropped out of left them
        ctx = ClientContext(
            client_id=client,
            cfg=self.cfg,
            data=self.data[client],
            resources=self.resources,
            state=self.states[client],
            workdir=self.workdir / "clients" / client,
            rnd=rnd,
            eval_data=self.eval_data[client],
            public=self.public,
        )
        outcome = run_task(self.tasks[task], ctx, task, message, *self.hooks)
        self.states[client] = ctx.state
        return outcome, peak_rss_mb()

    def get_states(self) -> dict[str, dict[str, Any]]:
        """The clients' states for the server's checkpoint: without their round secrets, which never
        leave the actor (``federation.SECRET``)."""
        return {cid: durable_state(state) for cid, state in self.states.items()}

    def set_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        for cid in self.states:
            self.states[cid] = dict(states.get(cid, {}))


class RayFederation(RoundKeeper):
    """The Federation contract on a pool of Ray actors; see the module docstring.

    Faults: an actor that dies (its process killed, out of memory, its machine gone) fails the tasks
    it held, each recorded in ``traffic.failed`` with the reason; the call returns the other replies
    and the round goes on if ``fed.min_replies`` replied. The actor is then replaced by a fresh one,
    and its clients' state comes back from the last checkpoint the federation holds: the states the
    runner's last ``state_dict()`` gathered (the end of the previous round) or ``load_state_dict``
    pushed (a resume); a client never checkpointed starts empty. Work a client did since that
    checkpoint is lost with the actor, as it would be with the server.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        tasks: Mapping[str, ClientTask],
        client_data: Mapping[str, list[Record]],
        workdir: Path,
        build_tasks: TaskBuilder,
        before_task: ClientHook | None = None,
        after_task: ReplyHook | None = None,
        tap: TapHook | None = None,
    ) -> None:
        self.cfg = cfg
        self.task_names = set(tasks)
        self.client_sizes = {cid: len(records) for cid, records in client_data.items()}
        self.traffic = Traffic()
        self.rnd = 0
        self.tap = tap
        count = max(1, min(cfg.ray.actors, len(self.client_sizes)))
        self.home = {cid: i % count for i, cid in enumerate(self.client_sizes)}
        self.saved: dict[str, dict[str, Any]] = {}
        self.ray = connect(cfg.ray, count)
        check_capacity(self.ray, cfg.ray, count)
        import yaml

        self._args = (yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False), count, str(workdir))
        self._build_tasks = build_tasks
        self._hooks = (before_task, after_task)
        self._actor_class = self.ray.remote(num_cpus=cfg.ray.num_cpus, num_gpus=cfg.ray.num_gpus)(ClientActor)
        self.actors: list[Any] = []
        try:
            self.actors = [self._start(index) for index in range(count)]
            self._wait_ready(self.actors)
        except BaseException:
            self.close()
            raise

    def _start(self, index: int) -> Any:
        config_yaml, count, workdir = self._args
        return self._actor_class.remote(config_yaml, index, count, workdir, self._build_tasks, self._hooks)

    def _wait_ready(self, actors: list[Any]) -> None:
        refs = [actor.ready.remote() for actor in actors]
        try:
            self.ray.get(refs, timeout=START_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:
            raise RunError(
                f"ray: the actors did not start within {START_TIMEOUT_S:g}s; does the instance have "
                f"{self.cfg.ray.num_cpus:g} CPUs and {self.cfg.ray.num_gpus:g} GPUs free per actor "
                "(ray.num_cpus, ray.num_gpus)?"
            ) from None
        except self.ray.exceptions.RayError as exc:
            raise RunError(f"ray: an actor failed to build the run: {last_line(exc)}") from None

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]:
        """Every client's task submitted at once (each actor runs its clients in order, the actors at
        the same time); the replies booked in the order of ``clients``."""
        if task not in self.task_names:
            raise unknown_task(task, self.task_names)
        pending = {client: self._submit(client, task, payload, clients) for client in clients}
        replies: dict[str, Payload] = {}
        dead: set[int] = set()
        for client in clients:
            ref, tag = pending[client]
            outcome = self._collect(client, task, ref, dead)
            if outcome is None:
                continue
            reply = settle(self.traffic, client, task, outcome, timeout, self.rnd)
            if reply is None:
                continue
            if self.tap is not None:
                self.tap("up", client, task, self.rnd, reply)
            accept(self.traffic, replies, client, reply, expect, self.rnd, tag)
        for index in sorted(dead):
            self._replace(index)
        return drop_outliers(replies, expect, self.cfg.fed.screen, self.traffic.rejected, self.rnd)

    def _submit(
        self, client: str, task: str, payload: Payload | Mapping[str, Payload], clients: list[str]
    ) -> tuple[Any, str]:
        """The task's Ray reference and the tag its reply must carry."""
        message, tag = outbound(
            self.traffic, payload, client, clients, self.cfg.fed.wire_dtype, task, self.rnd
        )
        if self.tap is not None:
            self.tap("down", client, task, self.rnd, message)
        return self.actors[self.home[client]].execute.remote(client, task, self.rnd, message), tag

    def _collect(self, client: str, task: str, ref: Any, dead: set[int]) -> Outcome | None:
        """The outcome of ``ref``; None when the task was lost with its actor (recorded, and the actor
        marked for replacement) or Ray could not run it."""
        index = self.home[client]
        errors = self.ray.exceptions
        try:
            outcome, rss = self.ray.get(ref)
        except (errors.RayActorError, errors.WorkerCrashedError, errors.ObjectLostError) as exc:
            dead.add(index)
            fail(self.traffic, client, task, f"ray actor {index} died: {first_line(exc)}", self.rnd)
            return None
        except errors.RayError as exc:
            fail(self.traffic, client, task, f"{type(exc).__name__}: {first_line(exc)}", self.rnd)
            return None
        name = f"actor{index}"
        self.traffic.actor_peak_rss_mb[name] = max(rss, self.traffic.actor_peak_rss_mb.get(name, 0.0))
        result: Outcome = outcome
        return result

    def _replace(self, index: int) -> None:
        """A fresh actor in place of a dead one, its clients' state from the last checkpoint."""
        log.warning("round %d: replacing ray actor %d", self.rnd, index)
        self.ray.kill(self.actors[index], no_restart=True)
        actor = self._start(index)
        self._wait_ready([actor])
        self.ray.get(actor.set_states.remote(self._own(index)))
        self.actors[index] = actor

    def state_dict(self) -> dict[str, Any]:
        """Every client's state, gathered from the actors (the server's checkpoint holds it)."""
        gathered: dict[str, dict[str, Any]] = {}
        for index, actor in enumerate(self.actors):
            try:
                gathered.update(self.ray.get(actor.get_states.remote()))
            except self.ray.exceptions.RayError as exc:
                log.warning("ray actor %d lost before the checkpoint (%s)", index, first_line(exc))
                self._replace(index)
                gathered.update(self._own(index))
        self.saved = {cid: gathered.get(cid, {}) for cid in self.client_sizes}
        return {"clients": self.saved}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state.get("clients", {})
        self.saved = {cid: dict(saved.get(cid, {})) for cid in self.client_sizes}
        self.ray.get([actor.set_states.remote(self._own(i)) for i, actor in enumerate(self.actors)])

    def _own(self, index: int) -> dict[str, dict[str, Any]]:
        """The saved states of the clients actor ``index`` serves (each actor is sent only its own)."""
        return {cid: self.saved.get(cid, {}) for cid, home in self.home.items() if home == index}

    def close(self) -> None:
        """End the actors (their CPUs and GPUs go back to the instance); the instance itself stays."""
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line, cut: Ray's messages carry whole remote tracebacks."""
    lines = _lines(exc)
    return (lines[0] if lines else type(exc).__name__)[:limit]


def last_line(exc: BaseException, limit: int = 300) -> str:
    """The last line of a remote traceback Ray relays: the exception the actor raised."""
    lines = _lines(exc)
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def _lines(exc: BaseException) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray colours the remote task's name
    return [line.strip() for line in text.splitlines() if line.strip()]
