"""The ``flower:`` and ``ray:`` sections: where the clients run when ``fed.backend`` is not the in-process
simulation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config.base import Section


class FlowerConfig(Section):
    """The Flower deployment (``fed.backend: flower``); see ``fedtune.flower``.

    ``superlink`` is where SuperNodes and ``flwr`` reach the SuperLink (``host:port``; port 0 =
    a free loopback port for the local deployment). ``tls`` and ``auth`` name directories: the
    TLS one holds ``ca.crt``, ``server.pem``, ``server.key``; the auth one holds each node's
    ``node<i>`` / ``node<i>.pub`` key pair. ``auto`` generates them for the local deployment.
    """

    superlink: str = "127.0.0.1:0"
    """Where SuperNodes and `flwr` reach the SuperLink."""
    client_data: Literal["partition", "own"] = "partition"
    """"partition": SuperNodes train on their partition of data.dataset (the server derives the same
    one and bounds each reply's num_examples by its size); "own": they bring their own data
    (supernode --data-path), so the server checks only that num_examples is positive."""
    tls: str | None = None
    """`auto` or a directory (above); `null`: no TLS."""
    auth: str | None = None
    """`auto` or a directory of node key pairs (above); `null`: no node authentication."""
    connect_timeout: float = Field(300.0, gt=0)
    """Seconds to wait for the SuperNodes to connect."""
    reply_timeout: float = Field(3600.0, gt=0)
    """Seconds to wait for a reply when `fed.client_timeout` is unset."""
    poll_interval: float = Field(0.1, gt=0)
    """Seconds between polls for replies."""


class RayConfig(Section):
    """The Ray backend (``fed.backend: ray``): a pool of persistent actors that run the clients' tasks.

    Client ``i`` is served by actor ``i % actors``; each actor loads the base models once and keeps its
    clients' data and state. ``num_cpus`` and ``num_gpus`` are what Ray reserves per actor (fractions
    of a GPU let several actors share one); the actor runs torch with ``int(num_cpus)`` threads.
    """

    actors: int = Field(2, ge=1)
    """Persistent actors in the pool (more than there are clients: the extra ones are not started)."""
    num_cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each actor; its torch thread count is int(num_cpus) (at least 1)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs Ray reserves for each actor (0.5: two actors share a GPU); 0: the actors run on the CPU."""
    address: str | None = None
    """A running Ray cluster to join (`ray start --head` prints it, e.g. 10.0.0.5:6379; `auto`: the one
    on this machine); null: start a private local instance sized to the actors."""
