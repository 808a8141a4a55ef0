"""A run: resolve the config, build data and models, loop rounds, checkpoint, write metrics."""

from __future__ import annotations

import json
import logging
import math
import platform
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.registry import client_tasks, get_algorithm
from fedtune.config import ExperimentConfig, dump_config, load_run_config
from fedtune.data.fingerprint import check_fingerprint, data_fingerprint
from fedtune.data.partition import category_counts
from fedtune.data.records import DataError
from fedtune.eval.evaluate import EvalResult, EvalSet, merge_results, prefixed
from fedtune.fl.budget import budget_stop
from fedtune.fl.checkpoint import (
    CheckpointDamaged,
    atomic_write_text,
    checkpoint_dirs,
    clean_partial,
    intact_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from fedtune.fl.federation import ClientTask, ServerContext, ServerFederation
from fedtune.fl.secagg import SecureFederation
from fedtune.fl.simulation import ClientHook, InProcessFederation, ReplyHook, TapHook
from fedtune.modelcard import finish_artifacts
from fedtune.progress import RunProgress, round_summary, summary_table
from fedtune.resources import Resources
from fedtune.rundata import DATA_FINGERPRINT, RunData, data_specs, pin_data_paths, prepare_data
from fedtune.rundir import deferred_interrupt, run_dir_lock
from fedtune.tracking import Trackers
from fedtune.train.loop import peak_rss_mb
from fedtune.version import __version__

log = logging.getLogger("fedtune")


FederationFactory = Callable[
    [ExperimentConfig, Mapping[str, ClientTask], RunData, Resources], ServerFederation
]
"""Builds the backend's Federation from the run's config, client tasks, data and server resources."""


def _versions() -> dict[str, str]:
    import peft
    import transformers

    return {
        "fedtune": __version__,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _eval_row(result: EvalResult) -> dict[str, Any]:
    row: dict[str, Any] = {"eval": result.metrics}
    if result.by_category:
        row["eval_by_category"] = result.by_category
    if result.by_client:
        row["eval_by_client"] = result.by_client
    return row


def gpu_peak_mb() -> float | None:
    """The process's peak GPU memory so far (MiB), summed over every GPU it sees: the run's model may sit
    on any of them (``model.device: cuda:1``), not on the current device alone; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return sum(torch.cuda.max_memory_allocated(index) for index in range(torch.cuda.device_count())) / 2**20


def _round_row(rnd: int, result: RoundResult, fed: ServerFederation) -> dict[str, Any]:
    """The metrics row of a round; the runner adds timings and evaluation."""
    traffic = fed.traffic
    row: dict[str, Any] = {
        "round": rnd,
        "clients": result.clients,
        "failed": traffic.failed,
        "rejected": traffic.rejected,
        "train_loss": result.train_loss,
        "num_examples": result.num_examples,
        "trained_examples": result.trained_examples,
        "tokens": result.tokens,
        "bytes_up": traffic.bytes_up,
        "bytes_down": traffic.bytes_down,
        "client_seconds": round(sum(traffic.client_seconds.values()), 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    if traffic.actor_peak_rss_mb:
        row["actor_peak_rss_mb"] = {k: round(v, 1) for k, v in sorted(traffic.actor_peak_rss_mb.items())}
    gpu = gpu_peak_mb()
    if gpu is not None:
        row["gpu_peak_mb"] = round(gpu, 1)
    row.update({k: round(v, 2) for k, v in result.extra.items()})
    return row


def metrics_line(row: dict[str, Any]) -> str:
    """``row`` as one line of strict JSON: a non-finite number (e.g. a client's NaN metric) is written
    as null, and the row's ``non_finite`` names where, so every line parses with any JSON reader."""
    found: list[str] = []

    def finite(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            return {k: finite(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            found.append(f"{path}: {value}")
            return None
        return value

    clean = finite(row, "")
    if found:
        clean["non_finite"] = found
    return json.dumps(clean, allow_nan=False) + "\n"


class Runner:
    """Owns one run directory; ``run()`` starts or continues it."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path | None = None,
        console: Console | None = None,
        before_task: ClientHook | None = None,
        after_task: ReplyHook | None = None,
        tap: TapHook | None = None,
        federation: FederationFactory | None = None,
    ) -> None:
        self.cfg = cfg
        self.federation = federation
        self.run_dir = Path(run_dir) if run_dir else cfg.run_dir()
        self.console = console or Console(stderr=True)
        self.before_task = before_task
        self.after_task = after_task
        self.tap = tap
        self.history: list[dict[str, Any]] = []
        self.untrained_categories: list[str] = []
        self.trackers: Trackers | None = None
        self.backend: Any = None
        """The federation ``_build`` made, before any wrapping (what ``run`` closes at the end)."""

    def _build(
        self, progress: RunProgress, resume: bool = False
    ) -> tuple[Algorithm, ServerFederation, ServerContext]:
        data = prepare_data(self.cfg)
        self._pin_data(data, resume)
        (self.run_dir / "data_stats.json").write_text(
            json.dumps(
                {
                    "dataset": self.cfg.data.dataset,
                    "scheme": self.cfg.data.partition.scheme,
                    "counts": category_counts(data.clients),
                    "eval_counts": dict(sorted(Counter(r.category for r in data.eval_records).items())),
                },
                indent=1,
            )
        )
        trained = {r.category for records in data.clients.values() for r in records}
        self.untrained_categories = sorted({r.category for r in data.eval_records} - trained)
        resources = Resources(self.cfg)
        algorithm = get_algorithm(self.cfg.algorithm)(self.cfg)
        if self.federation is not None:
            fed = self.federation(self.cfg, algorithm.all_client_tasks(), data, resources)
        elif self.cfg.fed.backend == "ray":
            fed = self._ray(algorithm, data)
        else:
            fed = self._in_process(algorithm, data, resources, progress)
        self.backend = fed
        if algorithm.secure is not None:  # the update task's arrays stay on the clients, summed masked
            fed = SecureFederation(fed, algorithm.secure)
        server = ServerContext(
            cfg=self.cfg,
            resources=resources,
            eval_records=data.eval_records,
            public_records=data.public_records,
            run_dir=self.run_dir,
            validation_records=data.validation_records,
            extra_eval=data.extra_eval,
            client_sizes={cid: len(recs) for cid, recs in data.clients.items()},
        )
        return algorithm, fed, server

    def _pin_data(self, data: RunData, resume: bool) -> None:
        """Record the data's fingerprint; on resume, refuse data that differs from the recorded one."""
        path = self.run_dir / DATA_FINGERPRINT
        now = data_fingerprint(data_specs(self.cfg), data.clients)
        if resume and path.is_file():
            check_fingerprint(json.loads(path.read_text()), now, path)
        else:
            atomic_write_text(path, json.dumps(now, indent=1))

    def _in_process(
        self, algorithm: Algorithm, data: RunData, resources: Resources, progress: RunProgress
    ) -> InProcessFederation:
        fed: InProcessFederation  # the reporter reads the round from the federation it is given to
        fed = InProcessFederation(
            self.cfg,
            algorithm.all_client_tasks(),
            data.clients,
            resources,
            self.run_dir,
            reporter=lambda client, task, index, count: progress.task(fed.rnd, client, task, index, count),
            before_task=self.before_task,
            after_task=self.after_task,
            tap=self.tap,
            client_eval=data.client_eval,
            public=data.public_records,
        )
        return fed

    def _ray(self, algorithm: Algorithm, data: RunData) -> ServerFederation:
        """The clients on Ray actors (``fed.backend: ray``); the hooks travel to the actors pickled."""
        from fedtune.fl.ray_backend import RayFederation

        return RayFederation(
            self.cfg,
            algorithm.all_client_tasks(),
            data.clients,
            self.run_dir,
            client_tasks,
            before_task=self.before_task,
            after_task=self.after_task,
            tap=self.tap,
        )

    def _close_backend(self) -> None:
        """Give back what the backend holds (Ray's actors and their CPUs/GPUs), the run over or not."""
        close = getattr(self.backend, "close", None)
        self.backend = None
        if callable(close):
            close()

    def _checkpoint(self, rnd: int, algorithm: Algorithm, fed: ServerFederation) -> None:
        tree = {
            "round": rnd,
            "algorithm": algorithm.state_dict(),
            "federation": fed.state_dict(),
            "history": self.history,
        }
        if algorithm.privacy is not None:  # the DP secret and ledger: in the checkpoint, nowhere else
            tree["privacy"] = algorithm.privacy.state_dict()
        save_checkpoint(self.run_dir, rnd, tree, keep=self.cfg.fed.keep_checkpoints)

    def _write_metrics(self) -> None:
        atomic_write_text(self.run_dir / "metrics.jsonl", "".join(metrics_line(row) for row in self.history))

    def _append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as handle:
            handle.write(metrics_line(row))

    def _restore(self, algorithm: Algorithm, fed: ServerFederation) -> int:
        clean_partial(self.run_dir)
        path, damaged = intact_checkpoint(self.run_dir)
        for reason in damaged:
            log.warning("skipping a damaged checkpoint: %s", reason)
            self.console.print(f"[yellow]warning:[/] skipping a damaged checkpoint: {reason}")
        if path is None:
            if damaged:
                raise CheckpointDamaged(
                    f"{self.run_dir}: no intact checkpoint to resume from:\n  " + "\n  ".join(damaged)
                )
            return -1
        tree = load_checkpoint(path)
        algorithm.load_state_dict(tree["algorithm"])
        fed.load_state_dict(tree["federation"])
        if algorithm.privacy is not None and "privacy" in tree:
            algorithm.privacy.load_state_dict(tree["privacy"])
        self.history = list(tree["history"])
        # metrics.jsonl may hold a row written after this checkpoint's parent died: rewrite it.
        self._write_metrics()
        return int(tree["round"])

    def _evaluate(
        self,
        rnd: int,
        algorithm: Algorithm,
        fed: ServerFederation,
        server: ServerContext,
        progress: RunProgress,
    ) -> dict[str, Any]:
        progress.phase(f"r{rnd} evaluating")
        with progress.generating():
            results = [algorithm.evaluate(rnd, server, fed, EvalSet("", server.eval_records))]
            if self.cfg.eval.personal:
                progress.phase(f"r{rnd} evaluating on the clients' held-out data")
                results.append(algorithm.evaluate_clients(rnd, server, fed))
            for name, records in server.extra_eval.items():
                progress.phase(f"r{rnd} evaluating on {name}")
                evaluated = algorithm.evaluate(rnd, server, fed, EvalSet(name, records))
                results.append(prefixed(evaluated, f"{name}/"))
        return _eval_row(merge_results(*results))

    def run(self, resume: bool = False) -> list[dict[str, Any]]:
        # Before anything is written: a tracker in report_to that is not installed stops the run here.
        trackers = Trackers(self.cfg, self.run_dir)
        if self.cfg.fed.backend == "ray" and self.federation is None:
            from fedtune.fl.ray_backend import import_ray

            import_ray()  # a missing extra stops the run here, naming it
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with run_dir_lock(self.run_dir):
            return self._run(resume, trackers)

    def _run(self, resume: bool, trackers: Trackers) -> list[dict[str, Any]]:
        self.trackers = trackers
        try:
            self._run_tracked(resume, trackers)
        except BaseException:
            trackers.finish(failed=True)
            raise
        finally:
            self._close_backend()
        self.print_summary()
        return self.history

    def _run_tracked(self, resume: bool, trackers: Trackers) -> None:
        if not resume:
            pin_data_paths(self.cfg)
            if checkpoint_dirs(self.run_dir):
                raise FileExistsError(
                    f"{self.run_dir} already holds a run; use `fedtune resume {self.run_dir}` or another "
                    "--output-dir"
                )
            # The thread count with the versions: it sets the order of float sums, which can move a run
            # that sits on the edge of divergence.
            run_facts = {"versions": _versions(), "threads": torch.get_num_threads()}
            dump_config(self.cfg, self.run_dir / "config.yaml", extra=run_facts)
        trackers.start()
        _seed_everything(self.cfg.seed)
        rounds = self.cfg.fed.rounds
        with RunProgress(self.console, rounds, enabled=self.cfg.progress) as progress:
            progress.phase("loading data and models")
            algorithm, fed, server = self._build(progress, resume)
            progress.phase("setting up")
            algorithm.setup(server)
            last = self._restore(algorithm, fed) if resume else -1
            if last >= rounds:
                self.console.print(
                    f"{self.run_dir} is already complete (round {last} of {rounds}): nothing to train; "
                    "its final model is written again and its table follows",
                    soft_wrap=True,
                )
            if algorithm.privacy is not None:
                algorithm.privacy.start(fed.client_ids(), algorithm.clients_per_round(fed))
            if last < 0:
                row: dict[str, Any] = {"round": 0}
                if self.cfg.eval.before:
                    row.update(self._evaluate(0, algorithm, fed, server, progress))
                if algorithm.privacy is not None:
                    row.update(algorithm.privacy.row())
                self.history = [row]
                with deferred_interrupt():
                    self._checkpoint(0, algorithm, fed)
                    self._write_metrics()
                last = 0
            trackers.catch_up(self.history)
            progress.progress.update(progress.rounds_task, completed=last)
            for rnd in range(last + 1, rounds + 1):
                # dp.max_epsilon, fed.budget_mb: end cleanly, the final artifacts are written
                stop = self._stop_reason(rnd, algorithm)
                if stop is not None:
                    log.warning(stop)
                    self.console.print(f"[yellow]{stop}[/]")
                    break
                self._one_round(rnd, algorithm, fed, server, progress)
        algorithm.save_final(server, self.run_dir / "artifacts")
        finish_artifacts(self.run_dir, self.cfg)
        trackers.finish([self.run_dir / name for name in ("artifacts", "config.yaml", "metrics.jsonl")])

    def _stop_reason(self, rnd: int, algorithm: Algorithm) -> str | None:
        """Why the run ends before round ``rnd`` (a resumed run ends there again), or None."""
        if algorithm.privacy is not None:
            reason = algorithm.privacy.stop_reason(rnd)
            if reason is not None:
                return reason
        over = budget_stop(self.history, self.cfg.fed.budget_mb)
        return over.message() if over is not None else None

    def _one_round(
        self,
        rnd: int,
        algorithm: Algorithm,
        fed: ServerFederation,
        server: ServerContext,
        progress: RunProgress,
    ) -> None:
        start = time.perf_counter()
        fed.begin_round(rnd)
        result = algorithm.run_round(rnd, server, fed)
        row = _round_row(rnd, result, fed)
        if algorithm.privacy is not None:
            row.update(algorithm.privacy.row())
        if algorithm.secure is not None:
            row.update(algorithm.secure.row())
        client_seconds = row["client_seconds"]
        # The round the budget will stop after is the final one: evaluate it like the configured last.
        final = (
            rnd == self.cfg.fed.rounds
            or budget_stop([*self.history, row], self.cfg.fed.budget_mb) is not None
        )
        if rnd % self.cfg.eval.every == 0 or final:
            row.update(self._evaluate(rnd, algorithm, fed, server, progress))
        elapsed = time.perf_counter() - start
        row["round_seconds"] = round(elapsed, 4)
        row["server_seconds"] = round(max(0.0, elapsed - client_seconds), 4)
        self.history.append(row)
        with deferred_interrupt():
            self._checkpoint(rnd, algorithm, fed)
            self._append_metrics(row)
            if self.trackers is not None:
                self.trackers.log(row)
        progress.end_round(rnd, round_summary(row))

    def print_summary(self) -> None:
        self.console.print(summary_table(self.history, self.cfg.name))
        last = self.history[-1] if self.history else {}
        if "dp_epsilon" in last:
            self.console.print(
                f"client-level DP: epsilon {last['dp_epsilon']:.4g} at delta {last['dp_delta']:g} after "
                f"round {last['round']} (noise multiplier {last['dp_noise_multiplier']:.4g}, sampling rate "
                f"{last['dp_sample_rate']:.4g}, clip norm {self.cfg.dp.clip_norm:g})"
            )
        if self.untrained_categories:
            self.console.print(
                f"categories in no client's training data (evaluated all the same): "
                f"{', '.join(self.untrained_categories)}"
            )


def run_experiment(cfg: ExperimentConfig, run_dir: Path | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return Runner(cfg, run_dir, **kwargs).run(resume=False)


def resume_experiment(run_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    if not (run_dir / "config.yaml").is_file():
        raise DataError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_run_config(run_dir)
    return Runner(cfg, run_dir, **kwargs).run(resume=True)
