"""Where and how ``fedtune serve`` listens: loopback unless told otherwise, uvicorn in the foreground or on
a background thread (tests, benchmarks, notebooks)."""

from __future__ import annotations

import ipaddress
import threading
import time
from typing import Any

import uvicorn

from fedtune.errors import RunError

API_KEY_ENV = "FEDTUNE_API_KEY"
"""The environment variable ``fedtune serve`` reads its bearer token from when ``--api-key`` is not given."""


class BindRefused(RunError):
    """A non-loopback address without ``--allow-remote``."""


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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


def serve_forever(app: Any, host: str, port: int) -> None:
    """Run ``app`` on ``host:port`` until interrupted (Ctrl-C)."""
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)).run()


class BackgroundServer:
    """``app`` served by uvicorn on a daemon thread, on ``port`` (0: a free one). ``url`` is the API base
    (``http://host:port/v1``) once ``start`` returns; ``stop`` shuts it down and frees the port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning", access_log=False
        )
        server = uvicorn.Server(config)
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
