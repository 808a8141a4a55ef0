"""A warm client worker: keeps one SuperNode's models and data loaded across Flower messages.

Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process, which would import torch
and load the model for every task of every round. A SuperNode started with a ``worker``
node-config entry (a Unix socket path; ``fedtune flower supernode`` and the local deployment
start the worker beside the SuperNode) instead has its ClientApp relay the task to this
long-lived process, which runs it with ``node.execute`` on models loaded once. The relay and the
worker speak a small framed protocol over the socket: a JSON header, then raw array buffers.

The worker is stateless as far as client state goes: the relay hands it ``context.state``'s
state (or nothing, and the worker reads the client's disk) and stores what comes back, so a
restarted worker or SuperNode loses nothing but its caches.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.fl.payload import Payload, check_payload

log = logging.getLogger("fedtune.flower")

_LENGTH = struct.Struct("!Q")


def pack_arrays(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[memoryview]]:
    """A payload (or a state's array dict) as a JSON-able description plus its raw buffers."""
    arrays: list[list[Any]] = []
    blobs: list[memoryview] = []
    scalars: dict[str, Any] = {}
    floats: list[str] = []
    for key, value in values.items():
        if isinstance(value, np.ndarray):
            contiguous = np.ascontiguousarray(value)
            arrays.append([key, contiguous.dtype.str, list(contiguous.shape)])
            blobs.append(contiguous.reshape(-1).view(np.uint8).data)
        else:
            scalars[key] = value
            if isinstance(value, float):
                floats.append(key)
    return {"order": list(values), "arrays": arrays, "scalars": scalars, "floats": floats}, blobs


def unpack_arrays(description: Mapping[str, Any], blobs: Sequence[bytearray]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for (key, dtype, shape), blob in zip(description["arrays"], blobs, strict=True):
        values[key] = np.frombuffer(blob, dtype=np.dtype(dtype)).reshape(shape)
    floats = set(description["floats"])
    for key, value in description["scalars"].items():
        values[key] = float(value) if key in floats else value
    return {key: values[key] for key in description["order"]}


def send_frame(sock: socket.socket, header: Mapping[str, Any], blobs: Sequence[memoryview] = ()) -> None:
    head = json.dumps({**header, "blob_sizes": [blob.nbytes for blob in blobs]}).encode()
    sock.sendall(_LENGTH.pack(len(head)) + head)
    for blob in blobs:
        sock.sendall(blob)


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:], size - received)
        if count == 0:
            raise ConnectionError("the peer closed the connection mid-frame")
        received += count
    return buffer


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[bytearray]]:
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    header: dict[str, Any] = json.loads(_recv_exact(sock, size))
    blobs = [_recv_exact(sock, blob_size) for blob_size in header.pop("blob_sizes")]
    return header, blobs


def relay(
    address: str,
    config_yaml: str,
    node_config: Mapping[str, Any],
    task: str,
    rnd: int,
    payload: Payload,
    state: tuple[Any, dict[str, np.ndarray]] | None,
) -> dict[str, Any]:
    """Run a task on the worker at ``address``: returns its reply header plus decoded values.

    ``state`` is ``(skeleton, arrays)`` from ``checkpoint.encode_tree`` (None: the worker reads
    the client's disk). The answer has ``reply`` (a payload or None), ``error``, ``malformed``,
    ``seconds`` and ``state`` (``(skeleton, arrays)`` or None).
    """
    request, blobs = pack_arrays(payload)
    header: dict[str, Any] = {
        "config": config_yaml,
        "node_config": dict(node_config),
        "task": task,
        "round": rnd,
        "payload": request,
    }
    if state is not None:
        state_description, state_blobs = pack_arrays(state[1])
        header["state"] = {"skeleton": state[0], "arrays": state_description}
        blobs += state_blobs
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        send_frame(sock, header, blobs)
        answer, reply_blobs = recv_frame(sock)
    count = len(answer["payload"]["arrays"]) if answer.get("payload") else 0
    answer["reply"] = unpack_arrays(answer["payload"], reply_blobs[:count]) if answer.get("payload") else None
    if answer.get("state") is not None:
        arrays = unpack_arrays(answer["state"]["arrays"], reply_blobs[count:])
        answer["state"] = (answer["state"]["skeleton"], arrays)
    return answer


def handle(header: dict[str, Any], blobs: list[bytearray]) -> tuple[dict[str, Any], list[memoryview]]:
    """The worker's side of one request."""
    from fedtune.fl.checkpoint import decode_tree, encode_tree
    from fedtune.flower.node import execute, node_runtime

    count = len(header["payload"]["arrays"])
    payload = check_payload(unpack_arrays(header["payload"], blobs[:count]), "relayed payload")
    state = None
    if header.get("state") is not None:
        arrays = unpack_arrays(header["state"]["arrays"], blobs[count:])
        state = dict(decode_tree(header["state"]["skeleton"], arrays))
    try:
        runtime = node_runtime(header["config"], header["node_config"])
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "malformed": False, "seconds": 0.0}, []
    outcome = execute(runtime, header["task"], int(header["round"]), payload, state)
    answer: dict[str, Any] = {
        "error": outcome.error,
        "malformed": outcome.malformed,
        "seconds": outcome.seconds,
        "client": runtime.client_id,
    }
    out_blobs: list[memoryview] = []
    if outcome.reply is not None:
        answer["payload"], out_blobs = pack_arrays(outcome.reply)
    if outcome.state is not None:
        skeleton, arrays = encode_tree(outcome.state)
        description, state_blobs = pack_arrays(arrays)
        answer["state"] = {"skeleton": skeleton, "arrays": description}
        out_blobs += state_blobs
    return answer, out_blobs


def serve(address: str) -> None:
    """Answer relayed tasks one at a time, forever (until killed)."""
    path = Path(address)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(address)
        server.listen(8)
        # Relays queue on the bound socket meanwhile: the first task must not pay ~10 s of imports.
        import fedtune.resources
        import fedtune.runner  # noqa: F401 (torch, transformers, peft, datasets)
        from fedtune.algorithms.registry import algorithm_names

        algorithm_names()
        log.info("fedtune client worker listening on %s", address)
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    header, blobs = recv_frame(conn)
                    answer, out_blobs = handle(header, blobs)
                    send_frame(conn, answer, out_blobs)
                except (ConnectionError, OSError) as exc:
                    log.warning("client worker: a relay connection broke: %s", exc)


TASK_NICENESS = 10
"""How much lower than its SuperNode's the priority of the process that trains is. A client training on
every core starved its SuperNode's heartbeat thread on a loaded machine, and the SuperLink dropped the
node ("failed to report a heartbeat within 2 x its expected interval"); Flower 1.41 fixes the interval
at 30 s, so the node itself must stay schedulable."""
_lowered = False


def lower_priority() -> None:
    """Run this process's tasks below the SuperNode's priority (once per process; no-op where the
    platform has no ``nice``)."""
    global _lowered
    if _lowered or not hasattr(os, "nice"):
        return
    try:
        os.nice(TASK_NICENESS)
    except OSError as exc:
        log.warning("could not lower the task process's priority: %s", exc)
    _lowered = True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fedtune's warm client worker for one SuperNode")
    parser.add_argument("--socket", required=True, help="Unix socket path (the node config's 'worker')")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lower_priority()
    serve(args.socket)


if __name__ == "__main__":
    main()
