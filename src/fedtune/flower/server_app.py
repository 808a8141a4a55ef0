"""The generic ``ServerApp``: the same ``Runner`` loop as simulation, on a ``GridFederation``.

Run-config values (written by ``app.write_app``): ``config`` (the resolved experiment YAML),
``run-dir`` (on the SuperLink's machine: metrics, checkpoints, artifacts go there) and
``resume`` (continue from the run directory's last complete checkpoint). The ServerApp waits
up to ``flower.connect_timeout`` seconds for a SuperNode per client, then runs the rounds with
whichever clients are connected (the others are recorded as failed when sampled).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    import yaml
    from rich.console import Console

    from fedtune.algorithms.registry import get_algorithm
    from fedtune.config import ExperimentConfig, validate_config
    from fedtune.fl.federation import ClientTask
    from fedtune.flower.grid import GridFederation
    from fedtune.flower.processes import die_with_parent
    from fedtune.resources import Resources
    from fedtune.rundata import RunData
    from fedtune.runner import Runner

    # The SuperExec that started this process watches the SuperLink; when the server machine's
    # processes are killed, this one must not live on as an orphan holding the run directory.
    parent = os.getppid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        raise SystemExit("the SuperExec that started this ServerApp is gone")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    run_config = context.run_config
    cfg = validate_config(yaml.safe_load(str(run_config["config"])), source="run config")
    run_dir = Path(str(run_config["run-dir"]))
    resume = bool(run_config.get("resume", False))

    def federation(
        cfg: ExperimentConfig, tasks: Mapping[str, ClientTask], data: RunData, resources: Resources
    ) -> GridFederation:
        fed = GridFederation(
            grid,
            data.clients,
            cfg.seed,
            query_tasks=getattr(get_algorithm(cfg.algorithm), "query_tasks", ()),
            reply_timeout=cfg.flower.reply_timeout,
            poll_interval=cfg.flower.poll_interval,
            # SuperNodes that bring their own data (flower.client_data: own) are bounded only by > 0.
            client_sizes={cid: len(recs) for cid, recs in data.clients.items()}
            if cfg.flower.client_data == "partition"
            else None,
            wire_dtype=cfg.fed.wire_dtype,
            screen=cfg.fed.screen,
        )
        connected = fed.wait_for_clients(len(data.clients), cfg.flower.connect_timeout)
        logging.getLogger("fedtune").info("%d of %d clients connected", len(connected), len(data.clients))
        return fed

    Runner(cfg, run_dir, console=Console(stderr=True), federation=federation).run(resume=resume)
