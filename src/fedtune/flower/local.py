"""A Flower deployment on loopback, and ``fedtune run --backend flower`` on it.

``LocalDeployment`` starts one SuperLink and one SuperNode per client (each with its warm client
worker) as subprocesses on free 127.0.0.1 ports; it submits the run, waits for it and stops
every process it started. ``run_local`` runs an experiment that way (logs and Flower state under
``<run dir>/flower/``); the run is submitted as a Flower App whose ServerApp runs the usual
``Runner`` loop, so the run directory (config, metrics.jsonl with bytes, checkpoints,
artifacts) is the one the in-process backend writes. Every process is stopped at the end,
on errors and on Ctrl-C; ``fedtune resume`` starts a fresh deployment and continues.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedtune.config import ExperimentConfig
from fedtune.fl.checkpoint import latest_checkpoint
from fedtune.flower.app import write_app
from fedtune.flower.connection import FlowerConnection, wait_for_run
from fedtune.flower.keys import make_node_keys
from fedtune.flower.node import task_names
from fedtune.flower.processes import (
    DeploymentError,
    flower_env,
    free_port,
    kill_tree,
    spawn,
    superlink_command,
    supernode_command,
    wait_until_serving,
    worker_command,
)
from fedtune.flower.tls import TlsFiles, make_tls
from fedtune.flower.watch import RunWatch

log = logging.getLogger("fedtune.flower")


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
        log.info("SuperLink up at %s", self.address)
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
        log.info("submitting the run to the SuperLink (flwr run packs the app first)")
        run_id = self.connection.submit(app_dir)
        log.info("Flower run %d submitted to the SuperLink at %s", run_id, self.address)
        watch = RunWatch(
            run_id,
            self.num_nodes,
            int(yaml.safe_load(config_yaml)["fed"]["rounds"]),
            run_dir / "metrics.jsonl",
            self.connection.online_nodes,
        )
        wait_for_run(self.connection, run_id, poll, alive=self._alive, watch=watch)

    def _alive(self) -> None:
        if self.superlink is not None and self.superlink.poll() is not None:
            raise DeploymentError(f"the SuperLink exited (code {self.superlink.returncode})")


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"flower.superlink: {address!r} is not host:port")
    return host, int(port)


def _num_clients(cfg: ExperimentConfig) -> int:
    return 1 if cfg.fed.mode == "centralized" else cfg.data.partition.num_clients


def local_deployment(cfg: ExperimentConfig, run_dir: Path) -> LocalDeployment:
    """The loopback deployment of ``cfg`` (``flower.superlink`` host and port, TLS, auth)."""
    host, port = split_address(cfg.flower.superlink)
    root = run_dir / "flower"
    deployment = LocalDeployment(
        root=root,
        num_nodes=_num_clients(cfg),
        tls=cfg.flower.tls is not None,
        auth=cfg.flower.auth is not None,
        host=host,
        port=port,
    )
    if cfg.flower.tls not in (None, "auto"):
        deployment.tls_dir = Path(cfg.flower.tls)
    if cfg.flower.auth not in (None, "auto"):
        deployment.keys_dir = Path(cfg.flower.auth)
    if deployment.tls_dir is not None and not TlsFiles.in_dir(deployment.tls_dir).exist():
        raise FileNotFoundError(f"flower.tls: {deployment.tls_dir} lacks ca.crt, server.pem or server.key")
    return deployment


def run_local(cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> None:
    """Run (or resume) ``cfg`` on a fresh loopback Flower deployment; raise if the run failed."""
    if not resume and latest_checkpoint(run_dir) is not None:
        raise FileExistsError(
            f"{run_dir} already holds a run; use `fedtune resume {run_dir}` or another --output-dir"
        )
    cfg.fed.backend = "flower"
    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False)
    with local_deployment(cfg, run_dir) as deployment:
        log.info(
            "Flower deployment: SuperLink %s, %d SuperNodes (logs in %s)",
            deployment.address,
            deployment.num_nodes,
            deployment.root / "logs",
        )
        deployment.run(config_yaml, run_dir, resume, task_names(config_yaml))
