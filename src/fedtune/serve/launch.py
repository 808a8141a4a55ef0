"""Where and how ``fedtune serve`` listens: loopback unless told otherwise, uvicorn in the foreground or on
a background thread (tests, benchmarks, notebooks).

The socket is bound before anything is announced, so the address printed is the one listened on (port 0:
the free port the system picked) and a taken port fails with its address before the model loads. An IPv6
address may be written with or without brackets (``::1``, ``[::1]``). Shutdown (SIGTERM, Ctrl-C, ``stop``)
waits ``GRACEFUL_SHUTDOWN_S`` seconds for requests in flight, then cancels them, which ends their decoding.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

import uvicorn

from fedtune.errors import RunError

API_KEY_ENV = "FEDTUNE_API_KEY"
"""The environment variable ``fedtune serve`` reads its bearer token from when ``--api-key`` is not given."""


GRACEFUL_SHUTDOWN_S = 3
LISTEN_BACKLOG = 2048
"""Connections the system queues before the server accepts them (uvicorn's default)."""
"""Seconds a shutdown waits for requests in flight before cancelling them (uvicorn's default: forever)."""


class BindRefused(RunError):
    """A non-loopback address without ``--allow-remote``, or an address that cannot be listened on."""


def bare_host(host: str) -> str:
    """``host`` without the brackets an IPv6 address has in a URL (``[::1]`` -> ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def url_host(host: str) -> str:
    """``host`` as it is written in a URL: an IPv6 address in brackets."""
    bare = bare_host(host)
    return f"[{bare}]" if ":" in bare else bare


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1 (with or without brackets)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare_host(host)).is_loopback
    except ValueError:
        return False


def open_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), not yet listening (``listen`` before the
    address is announced: until then a client is refused rather than left waiting on a model that loads)."""
    where = f"{url_host(host)}:{port}"
    if not 0 <= port <= 65535:
        raise BindRefused(f"cannot listen on {where}: a port is 1-65535 (0: any free one)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bare_host(host), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise BindRefused(f"cannot listen on {where}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise BindRefused(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def check_bind(host: str, allow_remote: bool, api_key: str | None) -> list[str]:
    """Refuse a non-loopback ``host`` without ``allow_remote``; the warnings to print when allowed."""
    if is_loopback(host):
        return []
    if not allow_remote:
        raise BindRefused(
            f"--host {host} would serve the model to other machines: pass --allow-remote to do that on "
            "purpose (and set --api-key or FEDTUNE_API_KEY), or leave --host out to serve on 127.0.0.1"
        )
    warnings = [f"serving on {host}: any machine that can reach this address can use the model"]
    if not api_key:
        warnings.append(
            f"no API key: anyone who can reach {host} may call it (set --api-key or {API_KEY_ENV})"
        )
    return warnings


def server_config(app: Any, host: str = "127.0.0.1", port: int = 0) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=bare_host(host),
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def serve_forever(app: Any, sock: socket.socket) -> None:
    """Run ``app`` on ``sock`` (``open_socket``) until SIGTERM or Ctrl-C."""
    uvicorn.Server(server_config(app)).run(sockets=[sock])


class BackgroundServer:
    """``app`` served by uvicorn on a daemon thread, on ``port`` (0: a free one). ``url`` is the API base
    (``http://host:port/v1``) once ``start`` returns; ``stop`` shuts it down and frees the port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        server = uvicorn.Server(server_config(self.app, self.host, self.port))
        thread = threading.Thread(target=server.run, name="fedtune-serve", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        self.port = int(server.servers[0].sockets[0].getsockname()[1])
        self._server, self._thread = server, thread
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        self._server = self._thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
