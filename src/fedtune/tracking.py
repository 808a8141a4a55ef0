"""Experiment trackers (``report_to``): TensorBoard, Weights & Biases and MLflow, fed from the rows of
``metrics.jsonl``.

Every tracker gets the same things: the resolved config when its run starts, every metrics row
(flattened to scalars, step = the round) and, at the end, the run's final artifacts. Each one works
with no network: TensorBoard writes event files to ``<run dir>/tensorboard``, W&B runs offline
(``<run dir>/wandb``, upload later with ``wandb sync``) unless ``WANDB_MODE`` says otherwise, and
MLflow writes a local store in ``<run dir>/mlflow`` unless ``MLFLOW_TRACKING_URI`` names a server.

``trackers.json`` in the run directory holds each tracker's run id and the last round it was given,
so ``fedtune resume`` continues the same tracked run and logs each round once. The tracker packages
are optional extras, imported only when a run uses them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from fedtune.config import ExperimentConfig
from fedtune.errors import RunError
from fedtune.fl.checkpoint import atomic_write_text

STATE_FILE = "trackers.json"
"""Each tracker's run id (``<name>: {...}``) and ``logged_round``, the last round every tracker got."""
CLIENT_PREFIX = "client/"
"""Per-client scalars (``eval_by_client``) are logged as ``client/<id>/<metric>``."""
ROW_SKIPPED = {"round", "non_finite"}
"""Keys of a metrics row that are not metrics: the round is the step; ``non_finite`` names nulls."""


class TrackerMissing(RunError):
    """A tracker named in ``report_to`` is not installed; the message names the extra to install."""


def require_trackers(names: Iterable[str]) -> None:
    """Refuse ``report_to`` names whose package is not installed (before a run writes anything)."""
    for name in names:
        backend = BACKENDS[name]
        if importlib.util.find_spec(backend.module) is None:
            raise TrackerMissing(
                f"report_to: {name!r} needs the {backend.module!r} package, which is not installed: "
                f"pip install 'fedtune[{name}]' (or remove {name!r} from report_to)"
            )


def flatten_row(row: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of a metrics row under slash-joined names (``eval/rougeL``,
    ``eval_by_category/<category>/<metric>``); each client's scalars (``eval_by_client``) under
    ``client/<id>/<metric>``. Strings, lists, nulls and non-finite numbers are left out, as
    ``metrics.jsonl`` writes a non-finite number as null."""
    found: dict[str, float] = {}

    def visit(value: Any, name: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{name}/{key}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            found[name] = float(value)

    for key, value in row.items():
        if key in ROW_SKIPPED:
            continue
        if key == "eval_by_client" and isinstance(value, Mapping):
            for client, metrics in value.items():
                visit(metrics, f"{CLIENT_PREFIX}{client}")
        else:
            visit(value, str(key))
    return found


class Tracker(ABC):
    """One tracker's run: started (or resumed) once per process, fed rows, given artifacts, finished."""

    name: ClassVar[str]
    module: ClassVar[str]
    """The package the tracker needs (its extra has the tracker's name)."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir

    @abstractmethod
    def start(self, state: Mapping[str, Any], logged_round: int) -> dict[str, Any]:
        """Open the tracked run: a new one (``state`` empty; the config is logged) or the one ``state``
        names (rounds after ``logged_round`` are logged again); the state to store for a resume."""

    @abstractmethod
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One round's scalars at step ``step`` (the round)."""

    def log_artifacts(self, files: Sequence[Path]) -> None:
        """The run's final files and directories (the adapter or the method's own files, the config,
        ``metrics.jsonl``); a tracker without artifact storage ignores them."""
        return None

    @abstractmethod
    def finish(self, failed: bool) -> None:
        """Close the tracked run (``failed``: the run stopped with an error or an interrupt)."""


class TensorBoardTracker(Tracker):
    """Event files in ``<run dir>/tensorboard``; a resume appends to the same directory, purging any
    round after the last one logged so no round appears twice."""

    name = "tensorboard"
    module = "tensorboard"
    DIR = "tensorboard"

    def start(self, state: Mapping[str, Any], logged_round: int) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        logdir = self.run_dir / self.DIR
        fresh = logged_round < 0
        self.writer = SummaryWriter(str(logdir), purge_step=None if fresh else logged_round + 1)
        if fresh:
            self.writer.add_text("config", config_markdown(self.cfg), 0)
        self.writer.flush()
        return {"logdir": self.DIR}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a killed run keeps every round it logged

    def finish(self, failed: bool) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run in ``<run dir>/wandb``: offline unless ``WANDB_MODE`` is set, project
    ``WANDB_PROJECT`` (default ``fedtune``); a resume opens the same run id (offline, a new segment
    of it that ``wandb sync`` uploads into the same run)."""

    name = "wandb"
    module = "wandb"

    def start(self, state: Mapping[str, Any], logged_round: int) -> dict[str, Any]:
        import wandb

        self.run = wandb.init(
            project=state.get("project") or os.environ.get("WANDB_PROJECT", "fedtune"),
            name=self.cfg.name,
            id=state.get("run_id"),
            resume="allow",
            dir=str(self.run_dir),
            mode=cast(Any, os.environ.get("WANDB_MODE", "offline")),
            config=self.cfg.to_yaml_dict(),
            settings=wandb.Settings(console="off", **self._flush_setting(wandb.Settings)),
        )
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        return {"run_id": self.run.id, "project": self.run.project}

    FLUSH_SECONDS = 0.5
    """How often W&B writes what it was given to its ``.wandb`` file (its default: 15 s); a process
    killed outright loses what came in the last interval."""

    @classmethod
    def _flush_setting(cls, settings: Any) -> dict[str, float]:
        name = "x_transaction_log_flush_interval"
        return {name: cls.FLUSH_SECONDS} if name in getattr(settings, "model_fields", {}) else {}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({"round": step, **metrics})

    def log_artifacts(self, files: Sequence[Path]) -> None:
        import wandb

        artifact = wandb.Artifact(f"{self.run.id}-final", type="model")
        for path in files:
            if path.is_dir():
                artifact.add_dir(str(path), name=path.name)
            else:
                artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker(Tracker):
    """An MLflow run in experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``fedtune``) at
    ``MLFLOW_TRACKING_URI``, by default a local store in ``<run dir>/mlflow``: an SQLite database
    (``mlflow.db``; a process killed mid-write leaves it intact, which MLflow's file store does not)
    and an ``artifacts`` directory. A resume reopens the same run id at the same store."""

    name = "mlflow"
    module = "mlflow"
    DIR = "mlflow"
    BATCH = 1000
    """MLflow's limit on metrics per ``log_batch`` call (params: 100)."""

    def start(self, state: Mapping[str, Any], logged_round: int) -> dict[str, Any]:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        for chatter in ("mlflow.store.db.utils", "alembic"):  # "creating tables" as the store is made
            logging.getLogger(chatter).setLevel(logging.WARNING)
        # The run directory's own store is stored as null, so a moved run directory still finds it.
        uri = state.get("tracking_uri") if state else os.environ.get("MLFLOW_TRACKING_URI")
        local = self.run_dir.resolve() / self.DIR
        if not uri:
            local.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{local / 'mlflow.db'}")
        run_id = state.get("run_id")
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedtune")
            found = self.client.get_experiment_by_name(name)
            experiment = (
                found.experiment_id
                if found
                else self.client.create_experiment(
                    name, artifact_location=None if uri else (local / "artifacts").as_uri()
                )
            )
            run_id = self.client.create_run(experiment, run_name=self.cfg.name).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in flat_config(self.cfg.to_yaml_dict()).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
            self.client.log_text(run_id, config_markdown(self.cfg), "config.md")
        self.run_id = str(run_id)
        return {"run_id": self.run_id, "tracking_uri": uri}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(_mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(entries), self.BATCH):
            self.client.log_batch(self.run_id, metrics=entries[i : i + self.BATCH])

    def log_artifacts(self, files: Sequence[Path]) -> None:
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), path.name)
            else:
                self.client.log_artifact(self.run_id, str(path))

    def finish(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _mlflow_key(key: str) -> str:
    """MLflow names take letters, digits and ``_-. /:``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-. /:" else "_" for c in key)


BACKENDS: dict[str, type[Tracker]] = {
    tracker.name: tracker for tracker in (TensorBoardTracker, WandbTracker, MlflowTracker)
}


def flat_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config's keys as dotted names (``fed.rounds``), for trackers that take flat parameters."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_markdown(cfg: ExperimentConfig) -> str:
    """The resolved config as a YAML block (what the run directory's config.yaml holds)."""
    import yaml

    return "```yaml\n" + yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False) + "```\n"


class Trackers:
    """The run's trackers as one: what the runner calls. With an empty ``report_to`` every call does
    nothing and no file is written.

    Built before the run writes anything (a tracker that is not installed is an error then);
    ``start`` opens every tracked run, ``catch_up`` logs the rows a resumed run's trackers have not
    had, ``log`` each new round, ``finish`` the final artifacts and the end.
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        require_trackers(cfg.report_to)
        self.cfg = cfg
        self.run_dir = run_dir
        self.trackers = [BACKENDS[name](cfg, run_dir) for name in cfg.report_to]
        self.state: dict[str, Any] = {}
        self.started: list[Tracker] = []

    @property
    def path(self) -> Path:
        return self.run_dir / STATE_FILE

    @property
    def logged_round(self) -> int:
        return int(self.state.get("logged_round", -1))

    def start(self) -> None:
        """Open each tracker's run: the one ``trackers.json`` names, or a new one."""
        if not self.trackers:
            return
        if self.path.is_file():
            self.state = json.loads(self.path.read_text())
        for tracker in self.trackers:
            self.state[tracker.name] = tracker.start(self.state.get(tracker.name, {}), self.logged_round)
            self.started.append(tracker)
        self._save()

    def catch_up(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Log the rows of ``history`` after the last round every tracker was given (all of them on a
        new run; after a resume, those the stopped process had not logged)."""
        if not self.trackers:
            return
        # A resume from an older checkpoint (a newer one was damaged) logs its later rounds again.
        last = int(history[-1]["round"]) if history else -1
        self.state["logged_round"] = min(self.logged_round, last)
        for row in history:
            if int(row["round"]) > self.logged_round:
                self.log(row)

    def log(self, row: Mapping[str, Any]) -> None:
        """One metrics row, as ``metrics.jsonl`` has it, to every tracker."""
        if not self.trackers:
            return
        metrics = flatten_row(row)
        if metrics:
            for tracker in self.started:
                tracker.log(int(row["round"]), metrics)
        self.state["logged_round"] = int(row["round"])
        self._save()

    def finish(self, artifacts: Sequence[Path] = (), failed: bool = False) -> None:
        """Log ``artifacts`` (those that exist) and close every tracked run; idempotent."""
        present = [path for path in artifacts if path.exists()]
        try:
            for tracker in self.started:
                if present and not failed:
                    tracker.log_artifacts(present)
        finally:
            started, self.started = self.started, []
            for tracker in started:
                tracker.finish(failed)

    def _save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.state, indent=1))
