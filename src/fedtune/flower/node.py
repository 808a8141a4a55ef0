"""One client's side of the Flower backend, independent of Flower: build the node, run a task.

``NodeRuntime`` is what a SuperNode needs to run one experiment's tasks: the config, this
node's client id and training data, and the lazily loaded models (``Resources``). ``execute``
runs one task in a ``ClientContext`` the way ``InProcessFederation`` does (same hooks, same
failure and malformed-reply bookkeeping) and persists the client state to disk.

Client state persists on the client's own disk as an atomic checkpoint per round under
``<client workdir>/flower_state``; a task of round ``r`` that is not handed its state (a fresh
Flower run after the server was killed, a restarted SuperNode) starts from the newest checkpoint
of a round before ``r``, so a re-run round starts from the same state as the first time.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.fl.payload import Payload, PayloadError, check_payload, from_wire, to_wire

BEFORE_TASK_ENV = "FEDTUNE_FLOWER_BEFORE_TASK"
AFTER_TASK_ENV = "FEDTUNE_FLOWER_AFTER_TASK"
"""Test seams, ``module:function``: the in-process backend's ``before_task`` / ``after_task`` hooks."""


@dataclass
class NodeRuntime:
    """What one SuperNode needs to run tasks of one experiment (built once per process)."""

    cfg: Any
    client_id: str
    data: list[Any]
    resources: Any
    workdir: Path
    tasks: dict[str, Any]
    eval_data: list[Any] = field(default_factory=list)
    public: list[Any] = field(default_factory=list)


@dataclass
class Outcome:
    """A task's result: the reply, or why there is none; the state to keep (None: unchanged)."""

    reply: Payload | None
    error: str | None
    malformed: bool
    state: dict[str, Any] | None
    seconds: float


_runtimes: dict[str, NodeRuntime] = {}


def node_runtime(config_yaml: str, node_config: dict[str, Any]) -> NodeRuntime:
    """The experiment's runtime on this node, cached per (config, node config) in this process."""
    key = json.dumps([config_yaml, node_config], sort_keys=True, default=str)
    if key not in _runtimes:
        _runtimes[key] = build_runtime(config_yaml, node_config)
    return _runtimes[key]


def task_names(config_yaml: str) -> list[str]:
    import yaml

    from fedtune.algorithms.registry import client_tasks
    from fedtune.config import validate_config

    cfg = validate_config(yaml.safe_load(config_yaml), source="run config")
    return list(client_tasks(cfg))


def build_runtime(config_yaml: str, node_config: dict[str, Any]) -> NodeRuntime:
    import yaml

    from fedtune.algorithms.registry import client_tasks
    from fedtune.config import validate_config
    from fedtune.resources import Resources
    from fedtune.rundata import prepare_data

    cfg = validate_config(yaml.safe_load(config_yaml), source="run config")
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no 'partition-id' in its --node-config")
    partition = int(node_config["partition-id"])
    if "cache-dir" in node_config:
        cfg.model.cache_dir = str(node_config["cache-dir"])
    run_data = prepare_data(cfg)
    partitions = run_data.clients
    client_ids = list(partitions)
    if not 0 <= partition < len(client_ids):
        raise ValueError(f"partition-id {partition} is outside 0..{len(client_ids) - 1}")
    client_id = client_ids[partition]
    data = partitions[client_id]
    eval_data = run_data.client_eval.get(client_id, [])
    if "data-path" in node_config:
        from fedtune.data.loaders import load_dataset_records
        from fedtune.data.partition import personal_split

        data = load_dataset_records(
            str(node_config["data-path"]),
            "train",
            format=cfg.data.format,
            schema=cfg.data.schema_,
            columns=cfg.data.columns,
        )
        if cfg.eval.personal:
            data, eval_data = personal_split(data, cfg.data.holdout, cfg.seed, client_id, cfg.data.eval_split)
    default_root = Path.home() / ".cache" / "fedtune" / "flower" / cfg.name
    root = Path(str(node_config.get("workdir", default_root))).expanduser()
    tasks = dict(client_tasks(cfg))
    workdir = root / "clients" / client_id
    return NodeRuntime(
        cfg, client_id, data, Resources(cfg), workdir, tasks, eval_data, run_data.public_records
    )


def _hook(variable: str) -> Any:
    target = os.environ.get(variable)
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def execute(
    runtime: NodeRuntime, task: str, rnd: int, payload: Payload, state: dict[str, Any] | None
) -> Outcome:
    """Run ``task`` of round ``rnd``; ``state`` None means: this client's state from its disk."""
    from fedtune.fl.federation import ClientContext, answer, durable_state, forget_secrets

    start = time.perf_counter()
    had_state = state is not None and bool(state)
    ctx = ClientContext(
        client_id=runtime.client_id,
        cfg=runtime.cfg,
        data=runtime.data,
        resources=runtime.resources,
        state=load_state(runtime.workdir, rnd) if state is None else state,
        workdir=runtime.workdir,
        rnd=rnd,
        eval_data=runtime.eval_data,
        public=runtime.public,
    )
    had_state = had_state or bool(ctx.state)
    forget_secrets(ctx.state, keep_round=rnd)  # a round this client dropped out of left them
    try:
        before = _hook(BEFORE_TASK_ENV)
        if before is not None:
            before(runtime.client_id, task, rnd)
        reply = answer(runtime.tasks[task], ctx, from_wire(payload))
        after = _hook(AFTER_TASK_ENV)
        if after is not None:
            reply = after(runtime.client_id, task, rnd, reply)
        reply = to_wire(check_payload(reply, f"client {runtime.client_id}"), runtime.cfg.fed.wire_dtype)
    except PayloadError as exc:
        return Outcome(None, str(exc), True, None, time.perf_counter() - start)
    except Exception as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}", False, None, time.perf_counter() - start)
    keep = ctx.state if (ctx.state or had_state) else None
    if keep is not None:  # the round's secrets stay in the SuperNode's memory (context.state), off disk
        save_state(runtime.workdir, rnd, durable_state(keep))
    return Outcome(reply, None, False, keep, time.perf_counter() - start)


def load_state(workdir: Path, rnd: int) -> dict[str, Any]:
    """The newest state this client saved in a round before ``rnd`` ({} if none)."""
    from fedtune.fl.checkpoint import load_checkpoint

    candidates = []
    for path in (workdir / "flower_state" / "checkpoints").glob("round_*"):
        number = path.name.removeprefix("round_")
        if number.isdigit() and int(number) < rnd and (path / "state.json").is_file():
            candidates.append((int(number), path))
    if not candidates:
        return {}
    return dict(load_checkpoint(max(candidates)[1])["state"])


def save_state(workdir: Path, rnd: int, state: dict[str, Any]) -> None:
    from fedtune.fl.checkpoint import save_checkpoint

    save_checkpoint(workdir / "flower_state", rnd, {"state": state}, keep=3)
