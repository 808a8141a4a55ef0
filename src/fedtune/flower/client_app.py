"""The generic ``ClientApp``: runs any registered algorithm's client tasks on a SuperNode.

Message types are ``"train.<task>"`` / ``"query.<task>"`` for every task of the run's algorithm
(``Algorithm.client_table(cfg)``; the run config's ``tasks`` lists them); they are registered with
``@app.train`` / ``@app.query`` when the app enters its lifespan, because only the run config
says which algorithm runs. ``"query.fedtune_hello"`` answers which partition this node serves.

What a SuperNode is told through its node config (``--node-config``):
- ``partition-id`` (required): which of the run's clients this node is (``client_<i>``);
- ``data-path`` (optional): this client's own training data (any format ``data.format``
  reads); without it the node computes its partition of ``data.dataset`` from the config,
  deterministically, as the simulation does;
- ``workdir`` (optional, default ``~/.cache/fedtune/flower/<run name>``): the client's own disk;
  its task files and persistent state live under ``<workdir>/clients/<client id>``;
- ``cache-dir`` (optional): this machine's model cache (``model.cache_dir``);
- ``worker`` (optional): the Unix socket of a warm client worker (``fedtune.flower.worker``)
  that runs the task on models loaded once; without it the task runs in this ClientApp process.

Client state (``ClientContext.state``) persists across rounds in Flower's ``context.state`` (an
``ArrayRecord`` plus a ``ConfigRecord`` with the tree's skeleton) and across restarts on the
client's disk (``node.save_state``); a message whose ``context.state`` holds no state (a new
Flower run, a restarted SuperNode) starts from the disk.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from fedtune.flower.codec import HELLO, MALFORMED, META, decode_meta, decode_payload, encode_payload

STATE_TREE = "fedtune.state.tree"
STATE_ARRAYS = "fedtune.state.arrays"
CLIENT_APP_RAISED_EXCEPTION = 2
"""``flwr.common.constant.ErrorCode.CLIENT_APP_RAISED_EXCEPTION``."""

app = ClientApp()
_registered: set[str] = set()

EncodedState = tuple[Any, dict[str, Any]]


@app.lifespan()
def _register_tasks(context: Context) -> Iterator[None]:
    for name in str(context.run_config.get("tasks", "")).split(","):
        if name and name not in _registered:
            app.train(name)(_handler(name))
            app.query(name)(_handler(name))
            _registered.add(name)
    yield


@app.query(HELLO)
def _hello(msg: Message, context: Context) -> Message:
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no 'partition-id' in its --node-config")
    meta = ConfigRecord({"partition-id": int(context.node_config["partition-id"])})
    return Message(RecordDict({META: meta}), reply_to=msg)


def _handler(task: str) -> Callable[[Message, Context], Message]:
    def handle(msg: Message, context: Context) -> Message:
        return run_task(task, msg, context)

    return handle


def run_task(task: str, msg: Message, context: Context) -> Message:
    """Run ``task`` here or on the node's worker; keep the client state; reply or report an error."""
    rnd = int(decode_meta(msg.content).get("round", 0))
    payload = decode_payload(msg.content)
    config_yaml = str(context.run_config["config"])
    node_config = dict(context.node_config)
    if "client-workdir" in context.run_config:
        node_config["workdir"] = context.run_config["client-workdir"]
    state = state_from_context(context)
    if "worker" in node_config:
        from fedtune.flower.worker import relay

        answer = relay(str(node_config["worker"]), config_yaml, node_config, task, rnd, payload, state)
    else:
        answer = _run_here(config_yaml, node_config, task, rnd, payload, state)
    if answer["error"] is not None:
        reason = (MALFORMED if answer["malformed"] else "") + str(answer["error"])
        return Message(Error(CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=msg)
    if answer.get("state") is not None:
        state_to_context(context, answer["state"], rnd)
    meta: dict[str, int | float | str] = {
        "seconds": float(answer["seconds"]),
        "client": str(answer["client"]),
    }
    return Message(encode_payload(answer["reply"], meta), reply_to=msg)


def _run_here(
    config_yaml: str,
    node_config: dict[str, Any],
    task: str,
    rnd: int,
    payload: dict[str, Any],
    state: EncodedState | None,
) -> dict[str, Any]:
    from fedtune.fl.checkpoint import decode_tree, encode_tree
    from fedtune.flower.node import execute, node_runtime
    from fedtune.flower.worker import lower_priority

    lower_priority()  # this ClientApp process trains: the SuperNode beside it must keep its heartbeat

    try:
        runtime = node_runtime(config_yaml, node_config)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "malformed": False}
    tree = None if state is None else dict(decode_tree(*state))
    outcome = execute(runtime, task, rnd, payload, tree)
    return {
        "reply": outcome.reply,
        "error": outcome.error,
        "malformed": outcome.malformed,
        "seconds": outcome.seconds,
        "client": runtime.client_id,
        "state": None if outcome.state is None else encode_tree(outcome.state),
    }


def state_from_context(context: Context) -> EncodedState | None:
    skeleton = context.state.config_records.get(STATE_TREE)
    if skeleton is None:
        return None
    arrays = context.state.array_records.get(STATE_ARRAYS, ArrayRecord())
    return json.loads(str(skeleton["tree"])), {key: array.numpy() for key, array in arrays.items()}


def state_to_context(context: Context, state: EncodedState, rnd: int) -> None:
    skeleton, arrays = state
    context.state[STATE_TREE] = ConfigRecord({"tree": json.dumps(skeleton), "round": rnd})
    context.state[STATE_ARRAYS] = ArrayRecord({key: Array(value) for key, value in arrays.items()})
