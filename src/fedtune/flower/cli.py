"""``fedtune flower ...``: the commands of a real, multi-machine Flower federation.

Server machine: ``certs`` (once), ``superlink``, ``register`` (each client's public key),
``submit``. Each client machine: ``keygen`` (once), ``supernode``. docs/multi-machine.md walks through them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

flower_app = typer.Typer(
    help="A real Flower federation: SuperLink on the server, one SuperNode per client machine.",
    no_args_is_help=True,
)

DEFAULT_HOME = Path.home() / ".cache" / "fedtune" / "flower"
SuperLinkOption = Annotated[str, typer.Option(help="the SuperLink's address as host:port")]
CaOption = Annotated[
    Path | None,
    typer.Option("--ca", help="the CA certificate (ca.crt) that signed the SuperLink's certificate"),
]
InsecureOption = Annotated[bool, typer.Option(help="no TLS (loopback experiments only)")]
HomeOption = Annotated[Path, typer.Option(help="Flower's state and installed apps (FLWR_HOME)")]


def _tls_or_insecure(ca: Path | None, insecure: bool) -> Path | None:
    if ca is None and not insecure:
        raise typer.BadParameter("give --ca CA_CERT (TLS) or --insecure")
    return None if insecure else ca


@flower_app.command("certs")
def certs(
    directory: Annotated[Path, typer.Argument(help="where ca.crt, server.pem and server.key go")],
    host: Annotated[
        list[str] | None, typer.Option("--host", help="the SuperLink's IPs / DNS names (repeatable)")
    ] = None,
) -> None:
    """Make a CA and the SuperLink's TLS certificate; copy ca.crt (only) to every client machine."""
    from fedtune.flower.tls import make_tls

    files = make_tls(directory, host or ["127.0.0.1", "localhost"])
    typer.echo(f"CA certificate (give to clients): {files.ca}\nserver certificate: {files.cert}")


@flower_app.command("keygen")
def keygen(
    private_key: Annotated[Path, typer.Argument(help="private key file to write (public: <file>.pub)")],
) -> None:
    """Make a SuperNode's ECDSA P-384 key pair; the server registers the .pub file."""
    from fedtune.flower.keys import make_node_key

    typer.echo(f"public key (give to the server): {make_node_key(private_key)}")


@flower_app.command("superlink")
def superlink(
    host: Annotated[str, typer.Option(help="address to listen on")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="port of the SuperLink's HTTP APIs (Fleet, Control)")] = 9093,
    tls: Annotated[Path | None, typer.Option(help="directory made by `fedtune flower certs`")] = None,
    auth: Annotated[bool, typer.Option(help="accept only registered SuperNodes")] = False,
    database: Annotated[Path | None, typer.Option(help="SQLite state (survives restarts)")] = None,
    insecure: InsecureOption = False,
    home: HomeOption = DEFAULT_HOME / "superlink",
) -> None:
    """Start the SuperLink on the server machine (runs until stopped)."""
    from fedtune.flower.processes import flower_env, superlink_command
    from fedtune.flower.tls import TlsFiles

    files = None
    if not insecure:
        if tls is None:
            raise typer.BadParameter("give --tls DIR (from `fedtune flower certs`) or --insecure")
        files = TlsFiles.in_dir(tls)
    command = superlink_command(host, port, files, auth=auth, database=database)
    os.execve(command[0], command, flower_env(home))


@flower_app.command("register")
def register(
    public_key: Annotated[Path, typer.Argument(help="a SuperNode's .pub file")],
    superlink: SuperLinkOption = "127.0.0.1:9093",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    home: HomeOption = DEFAULT_HOME / "cli",
) -> None:
    """Register a SuperNode's public key with a SuperLink started with --auth."""
    from fedtune.flower.connection import FlowerConnection

    FlowerConnection(home, superlink, _tls_or_insecure(ca, insecure)).write().register(public_key)
    typer.echo(f"registered {public_key}")


@flower_app.command("supernode")
def supernode(
    partition_id: Annotated[int, typer.Option(help="which client of the experiment this machine is")],
    superlink: SuperLinkOption = "127.0.0.1:9093",
    ca: CaOption = None,
    key: Annotated[Path | None, typer.Option(help="private key from `fedtune flower keygen`")] = None,
    data_path: Annotated[Path | None, typer.Option(help="this client's own training data")] = None,
    workdir: Annotated[Path | None, typer.Option(help="the client's disk (state, files)")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="this machine's model cache")] = None,
    runtime_port: Annotated[int, typer.Option(help="local port of the SuperNode's runtime API")] = 9094,
    worker: Annotated[bool, typer.Option(help="keep models loaded in a warm worker process")] = True,
    insecure: InsecureOption = False,
    home: HomeOption = DEFAULT_HOME / "supernode",
) -> None:
    """Start a SuperNode (and its warm worker) on a client machine (runs until stopped)."""
    from fedtune.flower.processes import (
        die_with_parent,
        flower_env,
        kill_tree,
        spawn,
        supernode_command,
        worker_command,
    )

    node_config: dict[str, int | float | str] = {"partition-id": partition_id}
    for name, value in (("data-path", data_path), ("workdir", workdir), ("cache-dir", cache_dir)):
        if value is not None:
            node_config[name] = str(value.expanduser().resolve())
    env = flower_env(home)
    logs = home / "logs"
    procs = []
    if worker:
        address = str(Path(tempfile.mkdtemp(prefix="fedtune-worker-")) / "worker.sock")
        procs.append(spawn(worker_command(address), logs / "worker.log", env))
        node_config["worker"] = address
    command = supernode_command(
        superlink, runtime_port, node_config, _tls_or_insecure(ca, insecure), key, runtime_host="127.0.0.1"
    )
    typer.echo(f"SuperNode for partition {partition_id} -> {superlink} (worker log: {logs / 'worker.log'})")
    node = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
    procs.append(node)
    # SIGTERM (a service manager stopping us) must also stop the SuperNode and the worker.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        node.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            kill_tree(proc)
    raise typer.Exit(code=node.returncode or 0)


@flower_app.command("submit")
def submit(
    config: Annotated[Path | None, typer.Argument(help="experiment YAML (not with --resume)")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides")] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="run directory on the SuperLink's machine")
    ] = None,
    resume: Annotated[bool, typer.Option(help="continue the run in --output-dir")] = False,
    superlink: SuperLinkOption = "127.0.0.1:9093",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    wait: Annotated[bool, typer.Option(help="wait for the run to finish")] = True,
    home: HomeOption = DEFAULT_HOME / "cli",
) -> None:
    """Submit an experiment to a running SuperLink; its ServerApp writes the run directory there."""
    import yaml

    from fedtune.config import load_config, load_run_config
    from fedtune.flower.app import write_app
    from fedtune.flower.connection import FlowerConnection, wait_for_run
    from fedtune.flower.node import task_names

    if resume:
        if output_dir is None:
            raise typer.BadParameter("--resume needs --output-dir RUN_DIR")
        cfg = load_run_config(output_dir)
    elif config is None:
        raise typer.BadParameter("give an experiment CONFIG (or --resume -o RUN_DIR)")
    else:
        cfg = load_config(config, overrides or [])
    cfg.fed.backend = "flower"
    run_dir = output_dir or cfg.run_dir()
    text = yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False)
    connection = FlowerConnection(home, superlink, _tls_or_insecure(ca, insecure)).write()
    app_dir = write_app(
        Path(tempfile.mkdtemp(prefix="fedtune-app-")), text, run_dir, resume, task_names(text)
    )
    run_id = connection.submit(app_dir)
    typer.echo(f"Flower run {run_id}: {cfg.name} -> {run_dir} (`flwr log {run_id}` with FLWR_HOME={home})")
    if wait:
        wait_for_run(connection, run_id, poll=5.0)
        connection.close()
        typer.echo(f"done: {run_dir}/metrics.jsonl")
