"""``fedtune run --backend flower``: the experiment on a Flower deployment started on loopback.

One SuperLink and one SuperNode per client run as subprocesses (logs and Flower state under
``<run dir>/flower/``); the run is submitted as a Flower App whose ServerApp runs the usual
``Runner`` loop, so the run directory (config, metrics.jsonl with bytes, checkpoints,
artifacts) is the one the in-process backend writes. Every process is stopped at the end,
on errors and on Ctrl-C; ``fedtune resume`` starts a fresh deployment and continues.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from fedtune.config import ExperimentConfig
from fedtune.fl.checkpoint import latest_checkpoint
from fedtune.fl.flower.deploy import LocalDeployment, TlsFiles, split_address
from fedtune.fl.flower.node import task_names

log = logging.getLogger("fedtune.flower")


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
