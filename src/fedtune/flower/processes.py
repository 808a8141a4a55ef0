"""Flower's processes: their command lines and environment, starting them, stopping them.

- ``superlink_command`` / ``supernode_command`` / ``worker_command``: the ``flower-superlink``,
  ``flower-supernode`` and client worker command lines (runtime dependency installation
  disabled: offline machines);
- ``flower_env``: the environment they run in (a ``FLWR_HOME``, no telemetry, this venv's
  executables first on ``PATH``);
- ``spawn`` / ``kill_tree`` / ``wait_until_serving``: start one with its log file, stop it with
  everything it started, wait until a SuperLink answers.

Every process started here dies with the process that started it (``PR_SET_PDEATHSIG`` on
Linux), and ``kill_tree`` kills whole process trees (a SuperNode's SuperExec and ClientApp
processes included), so nothing outlives a test or a killed ``fedtune run``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import psutil

from fedtune.flower.tls import TlsFiles


class DeploymentError(RuntimeError):
    """A Flower process did not start, or the run failed."""


def executable(name: str) -> str:
    """A Flower executable of this interpreter's environment (works without an activated venv)."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.is_file() else name


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# -- command lines -----------------------------------------------------------------------------


def superlink_command(
    host: str, port: int, tls: TlsFiles | None = None, auth: bool = False, database: Path | None = None
) -> list[str]:
    command = [executable("flower-superlink"), "--host", host, "--port", str(port)]
    command += ["--disable-runtime-dependency-installation"]
    if tls is None:
        command.append("--insecure")
    else:
        command += ["--ssl-ca-certfile", str(tls.ca), "--ssl-certfile", str(tls.cert)]
        command += ["--ssl-keyfile", str(tls.key)]
    if auth:
        command.append("--enable-supernode-auth")
    if database is not None:
        command += ["--database", str(database)]
    return command


def node_config_string(values: Mapping[str, int | float | str]) -> str:
    """``--node-config`` syntax: space-separated ``key=value``, strings TOML-quoted."""
    return " ".join(f"{key}={json.dumps(value)}" for key, value in values.items())


def supernode_command(
    superlink: str,
    runtime_port: int,
    node_config: Mapping[str, int | float | str],
    root_certificates: Path | None = None,
    private_key: Path | None = None,
    runtime_host: str = "127.0.0.1",
) -> list[str]:
    command = [executable("flower-supernode"), "--superlink", superlink]
    command += ["--host", runtime_host, "--port", str(runtime_port)]
    command += ["--node-config", node_config_string(node_config)]
    if root_certificates is None:
        command.append("--insecure")
    else:
        command += ["--root-certificates", str(root_certificates)]
    if private_key is not None:
        command += ["--auth-supernode-private-key", str(private_key)]
    return command


def worker_command(address: str) -> list[str]:
    return [sys.executable, "-m", "fedtune.flower.worker", "--socket", address]


# -- processes ---------------------------------------------------------------------------------


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: this process gets ``sig`` when its parent dies, even by SIGKILL (elsewhere: no-op)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)


def flower_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Flower starts its helpers (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"),
        # SuperExec looks for new tasks every second by default: a second of latency per message.
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL=os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1"),
    )
    env.update(extra or {})
    return env


def spawn(command: list[str], log_file: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[bytes] = open(log_file, "ab")  # noqa: SIM115 (the child owns it for its lifetime)
    try:
        return subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=dict(env), preexec_fn=die_with_parent
        )
    finally:
        handle.close()


def kill_tree(proc: subprocess.Popen[bytes], grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Stop ``proc`` and everything it started: ``sig``, then SIGKILL after ``grace`` seconds."""
    try:
        root = psutil.Process(proc.pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)
    _, alive = psutil.wait_procs(family, timeout=grace)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=grace)
    proc.poll()


def wait_until_serving(address: str, ca: Path | None, timeout: float = 60.0) -> None:
    import httpx

    scheme = "http" if ca is None else "https"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            verify: Any = True if ca is None else str(ca)
            if httpx.get(f"{scheme}://{address}/health", timeout=2.0, verify=verify).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise DeploymentError(f"the SuperLink at {address} did not start within {timeout:.0f}s")
