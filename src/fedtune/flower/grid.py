"""The Federation contract on a Flower ``Grid``: the server side of the Flower backend.

Each ``call`` sends one ``Message`` per sampled client (``message_type`` ``"train.<task>"``, or
``"query.<task>"`` for the algorithm's ``query_tasks``), waits for the replies until the
timeout, and returns them in the order of ``clients``, exactly as ``InProcessFederation`` does:
bytes are counted per client in both directions with ``payload_nbytes``, a client that raised,
was not connected or did not answer in time is absent and recorded in ``traffic.failed``, and
every reply passes ``validate_reply`` before it is returned (``traffic.rejected`` otherwise).

Clients are the stable ids of the run's partition (``client_0`` ...), never Flower node ids: a
SuperNode says which partition it serves (its ``partition-id`` node config) when it first shows
up, so sampling is seeded exactly as in simulation and a restarted SuperNode (a new node id)
takes its client's place again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fedtune.fl.federation import Traffic, per_client_payload, seeded_sample
from fedtune.fl.payload import Payload, PayloadError, from_wire, payload_nbytes, to_wire
from fedtune.fl.simulation import TapHook
from fedtune.fl.validation import Expect, ReplyRejected, addressed, check_answers, check_reply, drop_outliers
from fedtune.flower.codec import HELLO, MALFORMED, decode_meta, decode_payload, encode_payload

log = logging.getLogger("fedtune.fl")

TTL_MARGIN = 10.0
"""Seconds a message outlives its reply timeout, so that our own deadline normally ends the wait."""
_LOST = {3, 4}
"""``flwr.common.constant.ErrorCode`` MESSAGE_UNAVAILABLE and REPLY_MESSAGE_UNAVAILABLE."""


class GridFederation:
    """The Flower backend of the Federation contract (runs inside the ServerApp)."""

    def __init__(
        self,
        grid: Grid,
        client_ids: Iterable[str],
        seed: int,
        *,
        query_tasks: Iterable[str] = (),
        reply_timeout: float = 3600.0,
        hello_timeout: float = 120.0,
        poll_interval: float = 0.1,
        tap: TapHook | None = None,
        client_sizes: Mapping[str, int] | None = None,
        wire_dtype: str = "fp32",
        screen: float | None = None,
    ) -> None:
        self.grid = grid
        self.wire_dtype = wire_dtype
        self.screen = screen
        self.client_sizes = dict(client_sizes or {})
        self._client_ids = list(client_ids)
        self.seed = seed
        self.query_tasks = frozenset(query_tasks)
        self.reply_timeout = reply_timeout
        self.hello_timeout = hello_timeout
        self.poll_interval = poll_interval
        self.tap = tap
        self.traffic = Traffic()
        self.rnd = 0
        self.node_of: dict[str, int] = {}
        """client id -> the node id serving it now."""
        self._seen: dict[int, str | None] = {}
        """Every node id that said hello -> its client id (None: not one of this run's clients)."""

    def client_ids(self) -> list[str]:
        return list(self._client_ids)

    def sample(self, k: int, rnd: int) -> list[str]:
        return seeded_sample(self.client_ids(), k, self.seed, rnd)

    def begin_round(self, rnd: int) -> None:
        self.rnd = rnd
        self.traffic = Traffic()

    def state_dict(self) -> dict[str, Any]:
        # Client state lives on the clients (Flower context.state and their disk), not here.
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None

    def connected(self) -> list[str]:
        """The clients with a live SuperNode, after greeting the nodes that are new."""
        online = set(self.grid.get_node_ids())
        fresh = sorted(online - set(self._seen))
        if fresh:
            self._greet(fresh)
        self.node_of = {client: node for client, node in self.node_of.items() if node in online}
        return [client for client in self._client_ids if client in self.node_of]

    def wait_for_clients(self, count: int, timeout: float) -> list[str]:
        """Block until ``count`` clients are connected or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while True:
            clients = self.connected()
            if len(clients) >= count or time.monotonic() >= deadline:
                return clients
            time.sleep(min(1.0, self.poll_interval * 10))

    def _greet(self, nodes: list[int]) -> None:
        messages = {
            node: self._message(
                {}, node, "query." + HELLO, {"round": self.rnd}, self.hello_timeout + TTL_MARGIN
            )
            for node in nodes
        }
        # A SuperNode that vanished stays listed until the SuperLink misses its heartbeats (~40-60 s), and
        # its hello is never answered: once the nodes that did answer serve every client of the run, the
        # greeting stops waiting for the rest (a restarted node's new id has taken its client's place).
        replies = self._exchange(messages, self.hello_timeout, enough=self._serve_every_client)
        every_client_served = self._serve_every_client(replies)
        for node in nodes:
            reply = replies.get(node)
            if reply is None and every_client_served:
                log.info("SuperNode %d had not answered when every client was served; it is not used", node)
                self._seen[node] = None
                continue
            if reply is None or reply.has_error():
                log.warning("SuperNode %d did not say which client it serves; it is not used", node)
                self._seen[node] = None
                continue
            client = self._client_of_hello(reply)
            self._seen[node] = client
            if client is None:
                partition = decode_meta(reply.content).get("partition-id")
                log.warning("SuperNode %d serves partition %s, outside this run's clients", node, partition)
            else:
                # The newest node of a partition wins: a restarted SuperNode replaces its old self.
                self.node_of[client] = node
                log.info("SuperNode %d serves %s", node, client)

    def _client_of_hello(self, reply: Message) -> str | None:
        """The client a SuperNode's hello reply says it serves (None: outside this run's clients)."""
        partition = int(decode_meta(reply.content).get("partition-id", -1))
        return self._client_ids[partition] if 0 <= partition < len(self._client_ids) else None

    def _serve_every_client(self, replies: Mapping[int, Message]) -> bool:
        """Whether the hellos answered so far name a node for every client of the run."""
        served = {self._client_of_hello(reply) for reply in replies.values() if not reply.has_error()}
        return served.issuperset(self._client_ids)

    def _message(
        self, payload: Payload, node: int, message_type: str, meta: Mapping[str, Any], ttl: float
    ) -> Message:
        # The TTL ends soon after the wait: a node back late does not run a task nobody waits for.
        return Message(
            encode_payload(payload, meta),
            dst_node_id=node,
            message_type=message_type,
            group_id=str(self.rnd),
            ttl=ttl,
        )

    def _exchange(
        self,
        messages: Mapping[int, Message],
        timeout: float,
        enough: Callable[[Mapping[int, Message]], bool] | None = None,
    ) -> dict[int, Message]:
        """Push ``messages`` (by destination node), pull replies until all came, ``timeout`` passed or
        the replies so far are ``enough``."""
        if not messages:
            return {}
        ids = list(self.grid.push_messages(list(messages.values())))
        node_of_message = dict(zip(ids, messages, strict=True))
        pending = set(ids)
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + timeout
        while pending:
            for reply in self.grid.pull_messages(pending):
                message_id = reply.metadata.reply_to_message_id
                if message_id in pending:
                    pending.discard(message_id)
                    replies[node_of_message[message_id]] = reply
            if not pending or time.monotonic() >= deadline or (enough is not None and enough(replies)):
                break
            time.sleep(self.poll_interval)
        return replies

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]:
        self.connected()
        category = "query" if task in self.query_tasks else "train"
        wait = timeout if timeout is not None else self.reply_timeout
        messages: dict[int, Message] = {}
        client_of: dict[int, str] = {}
        tags: dict[str, str] = {}
        for client in clients:
            node = self.node_of.get(client)
            if node is None:
                self.traffic.failed[client] = "not connected (no SuperNode serves this client)"
                log.warning("round %d: client %s has no SuperNode", self.rnd, client)
                continue
            message, tags[client] = addressed(
                to_wire(per_client_payload(payload, client, clients), self.wire_dtype), task, self.rnd
            )
            self.traffic.add("down", client, payload_nbytes(message))
            if self.tap is not None:
                self.tap("down", client, task, self.rnd, message)
            meta = {"round": self.rnd, "task": task, "client": client}
            messages[node] = self._message(message, node, f"{category}.{task}", meta, wait + TTL_MARGIN)
            client_of[node] = client
        replies = self._exchange(messages, wait)
        accepted: dict[str, Payload] = {}
        for node, client in client_of.items():
            reply = replies.get(node)
            if reply is None:
                self.traffic.failed[client] = f"late: no reply within {wait:.1f}s"
                log.warning("round %d: client %s did not reply within %.1fs", self.rnd, client, wait)
                continue
            checked = self._accept(client, task, reply, expect, wait, tags[client])
            if checked is not None:
                accepted[client] = checked
        ordered = {client: accepted[client] for client in clients if client in accepted}
        return drop_outliers(ordered, expect, self.screen, self.traffic.rejected, self.rnd)

    def _accept(
        self, client: str, task: str, reply: Message, expect: Expect | None, wait: float, tag: str
    ) -> Payload | None:
        if reply.has_error() and reply.error.code in _LOST:
            # The SuperLink answers for a node that never replied (TTL expired, node removed).
            self.traffic.failed[client] = f"late: no reply within {wait:.1f}s ({reply.error.reason})"
            log.warning("round %d: client %s did not reply: %s", self.rnd, client, reply.error.reason)
            return None
        if reply.has_error():
            reason = str(reply.error.reason)
            book = self.traffic.rejected if reason.startswith(MALFORMED) else self.traffic.failed
            book[client] = reason.removeprefix(MALFORMED)
            log.warning("round %d: client %s failed in task %s: %s", self.rnd, client, task, reason)
            return None
        content: RecordDict = reply.content
        try:
            payload = decode_payload(content)
        except PayloadError as exc:
            self.traffic.rejected[client] = str(exc)
            return None
        seconds = decode_meta(content).get("seconds")
        if isinstance(seconds, (int, float)):
            self.traffic.add("client_seconds", client, float(seconds))
        self.traffic.add("up", client, payload_nbytes(payload))
        if self.tap is not None:
            self.tap("up", client, task, self.rnd, payload)
        try:
            return check_reply(check_answers(from_wire(payload), tag, self.rnd), expect, client)
        except PayloadError as exc:
            self.traffic.rejected[client] = str(exc)
            return None
        except ReplyRejected as exc:
            self.traffic.rejected[client] = str(exc)
            log.warning("round %d: rejected the reply of client %s: %s", self.rnd, client, exc)
            return None
