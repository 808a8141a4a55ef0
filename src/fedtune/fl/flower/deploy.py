"""Start, use and stop Flower processes: a local deployment on loopback, or one side of a real one.

Pieces (each usable alone, which is what ``fedtune flower superlink|supernode|submit`` do):
- ``make_tls`` / ``make_node_keys``: a CA plus a server certificate for the SuperLink, and the
  ECDSA P-384 OpenSSH key pairs SuperNode authentication uses (``cryptography``, no openssl);
- ``superlink_command`` / ``supernode_command``: the ``flower-superlink`` / ``flower-supernode``
  command lines (runtime dependency installation disabled: offline machines);
- ``FlowerConnection``: a ``FLWR_HOME`` whose ``config.toml`` names the SuperLink, used by
  ``flwr run`` (submit), ``flwr supernode register`` and the run-status polls;
- ``write_app``: the Flower App (a ``pyproject.toml`` naming the generic ServerApp and
  ClientApp, with the experiment's resolved config as a run-config value);
- ``LocalDeployment``: one SuperLink and one SuperNode per client as subprocesses on free
  127.0.0.1 ports; it submits the run, waits for it and stops every process it started.

Every process started here dies with the process that started it (``PR_SET_PDEATHSIG`` on
Linux), and ``stop`` kills whole process trees (a SuperNode's SuperExec and ClientApp processes
included), so nothing outlives a test or a killed ``fedtune run``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import io
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

log = logging.getLogger("fedtune.flower")

CONNECTION = "fedtune"
SERVER_APP = "fedtune.fl.flower.server_app:app"
CLIENT_APP = "fedtune.fl.flower.client_app:app"
FINISHED = "finished"


class DeploymentError(RuntimeError):
    """A Flower process did not start, or the run failed."""


def _bin(name: str) -> str:
    """A Flower executable of this interpreter's environment (works without an activated venv)."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.is_file() else name


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"flower.superlink: {address!r} is not host:port")
    return host, int(port)


# -- certificates and keys ---------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TlsFiles:
        return cls(directory / "ca.crt", directory / "server.pem", directory / "server.key")

    def exist(self) -> bool:
        return self.ca.is_file() and self.cert.is_file() and self.key.is_file()


def make_tls(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A CA and a server certificate for ``hosts`` (IPs or DNS names), written once into ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    files = TlsFiles.in_dir(directory)
    if files.exist():
        return files
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedtune flower CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.cert.write_bytes(server_cert.public_bytes(pem))
    files.key.write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    files.key.chmod(0o600)
    return files


def make_node_key(private: Path) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format (``private`` and ``private.pub``); kept if present."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = private.with_name(private.name + ".pub")
    if private.is_file() and public.is_file():
        return public
    private.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return public


def make_node_keys(directory: Path, count: int) -> list[Path]:
    """Private key paths ``node0`` ... ``node<count-1>`` under ``directory`` (public: ``.pub``)."""
    keys = [directory / f"node{i}" for i in range(count)]
    for key in keys:
        make_node_key(key)
    return keys


# -- command lines -----------------------------------------------------------------------------


def superlink_command(
    host: str, port: int, tls: TlsFiles | None = None, auth: bool = False, database: Path | None = None
) -> list[str]:
    command = [_bin("flower-superlink"), "--host", host, "--port", str(port)]
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
    command = [_bin("flower-supernode"), "--superlink", superlink]
    command += ["--host", runtime_host, "--port", str(runtime_port)]
    command += ["--node-config", node_config_string(node_config)]
    if root_certificates is None:
        command.append("--insecure")
    else:
        command += ["--root-certificates", str(root_certificates)]
    if private_key is not None:
        command += ["--auth-supernode-private-key", str(private_key)]
    return command


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


def worker_command(address: str) -> list[str]:
    return [sys.executable, "-m", "fedtune.fl.flower.worker", "--socket", address]


# -- talking to a SuperLink --------------------------------------------------------------------


@dataclass
class FlowerConnection:
    """A ``FLWR_HOME`` whose ``config.toml`` points ``flwr`` at one SuperLink."""

    home: Path
    address: str
    root_certificates: Path | None = None
    _client: Any = None

    def __post_init__(self) -> None:
        # flwr requires an absolute path to the CA certificate.
        if self.root_certificates is not None:
            self.root_certificates = self.root_certificates.expanduser().resolve()

    def write(self) -> FlowerConnection:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
        lines.append(f"address = {json.dumps(self.address)}")
        if self.root_certificates is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {json.dumps(str(self.root_certificates))}")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")
        return self

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_bin("flwr"), *args],
            env=flower_env(self.home),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def register(self, public_key: Path) -> None:
        done = self.flwr("supernode", "register", str(public_key), CONNECTION, "--format", "json")
        if done.returncode != 0:
            raise DeploymentError(f"flwr supernode register {public_key} failed:\n{done.stdout}{done.stderr}")

    def submit(self, app_dir: Path) -> int:
        done = self.flwr("run", str(app_dir), CONNECTION, "--format", "json")
        try:
            answer = json.loads(done.stdout[done.stdout.index("{") :])
            return int(answer["run-id"])
        except (ValueError, KeyError, TypeError):
            raise DeploymentError(f"flwr run failed:\n{done.stdout}{done.stderr}") from None

    def status(self, run_id: int) -> tuple[str, str, str]:
        """``(status, sub_status, details)`` of a run, e.g. ``("finished", "completed", "")``."""
        from flwr.common.serde import run_from_proto
        from flwr.proto.control_pb2 import ListRunsRequest

        response = self._control().ListRuns(ListRunsRequest(run_id=run_id))
        run = run_from_proto(response.run_dict[run_id])
        return run.status.status, run.status.sub_status, run.status.details

    def _control(self) -> Any:
        """The Control API client, made once (flwr's CLI helper prints a line; keep it quiet)."""
        if self._client is None:
            from flwr.cli.typing import SuperLinkConnection
            from flwr.cli.utils import init_http_client_from_connection

            os.environ["FLWR_HOME"] = str(self.home)
            connection = SuperLinkConnection(
                name=CONNECTION,
                address=self.address,
                root_certificates=None if self.root_certificates is None else str(self.root_certificates),
                insecure=self.root_certificates is None,
            )
            with contextlib.redirect_stdout(io.StringIO()):
                self._client = init_http_client_from_connection(connection)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def logs(self, run_id: int) -> str:
        done = self.flwr("log", str(run_id), CONNECTION, "--show")
        return done.stdout + done.stderr


def write_app(
    app_dir: Path,
    config_yaml: str,
    run_dir: Path,
    resume: bool,
    tasks: Sequence[str],
    client_workdir: Path | None = None,
) -> Path:
    """The Flower App to submit: the generic ServerApp/ClientApp and this run's config.

    ``client_workdir`` (loopback only: every node shares this machine's disk) puts the clients'
    files under the run directory, as in simulation, whatever the nodes' ``workdir``.
    """
    run_config: dict[str, str | bool] = {
        "config": config_yaml,
        "run-dir": str(run_dir.resolve()),
        "resume": resume,
        "tasks": ",".join(tasks),
    }
    if client_workdir is not None:
        run_config["client-workdir"] = str(client_workdir.resolve())
    import tomli_w

    app_dir.mkdir(parents=True, exist_ok=True)
    project = {
        "project": {
            "name": "fedtune-run",
            "version": "1.0.0",
            "description": "A fedtune experiment on Flower",
            "license": "Apache-2.0",
            "dependencies": [],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedtune",
                    "components": {"serverapp": SERVER_APP, "clientapp": CLIENT_APP},
                    "config": run_config,
                }
            }
        },
    }
    (app_dir / "pyproject.toml").write_text(tomli_w.dumps(project))
    return app_dir


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


# -- the local deployment ----------------------------------------------------------------------


@dataclass
class LocalDeployment:
    """One SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1, all subprocesses of this one."""

    root: Path
    num_nodes: int
    tls: bool = False
    auth: bool = False
    workdir: Path | None = None
    node_env: Callable[[int], Mapping[str, str]] = field(default=lambda i: {})
    host: str = "127.0.0.1"
    port: int = 0
    tls_dir: Path | None = None
    """Existing certificates (``ca.crt``, ``server.pem``, ``server.key``); default: generated."""
    keys_dir: Path | None = None
    """Node key pairs ``node<i>`` / ``node<i>.pub``; default: generated (missing ones always are)."""
    workers: bool = True
    """Run each node's tasks on a warm client worker (models loaded once) rather than per message."""
    superlink: subprocess.Popen[bytes] | None = None
    nodes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    socket_dir: Path | None = None
    tls_files: TlsFiles | None = None
    keys: list[Path] = field(default_factory=list)
    connection: FlowerConnection | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> LocalDeployment:
        self.port = self.port or free_port(self.host)
        tls_dir = self.tls_dir or self.root / "tls"
        self.tls_files = make_tls(tls_dir, (self.host, "localhost")) if self.tls else None
        ca = self.tls_files.ca if self.tls_files else None
        home = self.root / "superlink"
        self.superlink = spawn(
            superlink_command(self.host, self.port, self.tls_files, self.auth),
            self.root / "logs" / "superlink.log",
            flower_env(home),
        )
        wait_until_serving(self.address, ca)
        self.connection = FlowerConnection(self.root / "cli", self.address, ca).write()
        if self.auth:
            self.keys = make_node_keys(self.keys_dir or self.root / "keys", self.num_nodes)
            for key in self.keys:
                self.connection.register(key.with_name(key.name + ".pub"))
        for index in range(self.num_nodes):
            self.start_node(index)
        return self

    def start_node(
        self, index: int, private_key: Path | None = None, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start (or restart) the SuperNode of partition ``index`` (``env``: extra variables)."""
        node_config: dict[str, int | float | str] = {"partition-id": index}
        if self.workdir is not None:
            node_config["workdir"] = str(self.workdir.resolve())
        env = flower_env(self.root / f"node{index}", {**self.node_env(index), **(env or {})})
        if self.workers:
            # Unix socket paths are limited to ~100 bytes: keep them out of deep run directories.
            if self.socket_dir is None:
                self.socket_dir = Path(tempfile.mkdtemp(prefix="fedtune-flower-"))
            address = str(self.socket_dir / f"node{index}.sock")
            self.worker_procs[index] = spawn(
                worker_command(address), self.root / "logs" / f"worker{index}.log", env
            )
            node_config["worker"] = address
        key = private_key or (self.keys[index] if self.keys else None)
        command = supernode_command(
            self.address,
            free_port(self.host),
            node_config,
            root_certificates=self.tls_files.ca if self.tls_files else None,
            private_key=key,
        )
        proc = spawn(command, self.root / "logs" / f"node{index}.log", env)
        self.nodes[index] = proc
        return proc

    def kill_node(self, index: int) -> None:
        """SIGKILL a SuperNode, its ClientApp processes and its worker: a machine that vanished."""
        for proc in (self.nodes.pop(index, None), self.worker_procs.pop(index, None)):
            if proc is not None:
                kill_tree(proc, grace=0.0, sig=signal.SIGKILL)

    def stop(self) -> None:
        if self.connection is not None:
            self.connection.close()
        for proc in [*self.nodes.values(), *self.worker_procs.values()]:
            kill_tree(proc)
        self.nodes.clear()
        self.worker_procs.clear()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
        if self.superlink is not None:
            kill_tree(self.superlink)
            self.superlink = None

    def __enter__(self) -> LocalDeployment:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(
        self, config_yaml: str, run_dir: Path, resume: bool, tasks: Sequence[str], poll: float = 1.0
    ) -> None:
        """Submit the experiment, wait until the run finishes; raise DeploymentError if it failed."""
        assert self.connection is not None, "start() first"
        app_dir = write_app(self.root / "app", config_yaml, run_dir, resume, tasks, client_workdir=run_dir)
        run_id = self.connection.submit(app_dir)
        log.info("Flower run %d submitted to the SuperLink at %s", run_id, self.address)
        wait_for_run(self.connection, run_id, poll, alive=self._alive)

    def _alive(self) -> None:
        if self.superlink is not None and self.superlink.poll() is not None:
            raise DeploymentError(f"the SuperLink exited (code {self.superlink.returncode})")


def wait_for_run(
    connection: FlowerConnection, run_id: int, poll: float = 1.0, alive: Callable[[], None] | None = None
) -> None:
    while True:
        if alive is not None:
            alive()
        status, sub_status, details = connection.status(run_id)
        if status == FINISHED:
            if sub_status != "completed":
                tail = "\n".join(connection.logs(run_id).splitlines()[-40:])
                raise DeploymentError(f"Flower run {run_id} {sub_status}: {details}\n{tail}")
            return
        time.sleep(poll)
