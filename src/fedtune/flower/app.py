"""The Flower App a run is submitted as: a ``pyproject.toml`` naming the generic ServerApp and
ClientApp (``server_app`` / ``client_app``), with the experiment's resolved config as a
run-config value."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SERVER_APP = "fedtune.flower.server_app:app"
CLIENT_APP = "fedtune.flower.client_app:app"


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
