"""FedMKT's models, shared by its table (`experiments/fedmkt_table.py`) and its trajectory over rounds
(`experiments/fedmkt_rounds.py`): the SLMs a setting holds and which clients hold each, the metric of a
dataset, a metrics row's score of the LLM and of each SLM, the colour of each model in the plots, and
where a row's run lies (a row at its own lr, ``--row-lr``, has runs of its own; so has FedMKT with its LLM
at an lr apart from its SLMs', ``fedmkt-llm``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# the --row-lr key that trains FedMKT's LLM (fedmkt.llm_train.lr) apart from its SLMs (the row's train.lr)
FEDMKT_LLM = "fedmkt-llm"
# how a run directory's stem names that lr: ``<name>-llmlr<lr>`` (then the row's ``-lr<lr>``, the seed)
LLM_LR_STEM = re.compile(r"-llmlr\d[\d.e+-]*$")

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]  # the LLM, then each SLM, in both plots


def metric_of(cfg: Any, dataset: str) -> str:
    """The metric a dataset's cells hold: Rouge-L for instruction following, else the config's first."""
    return "rougeL" if dataset == "instruct" else str(cfg.eval.metrics[0])


def slms(cfg: Any, setting: str) -> list[str]:
    """The distinct SLMs a setting's clients hold, in the order of ``fedmkt.clients``."""
    distinct = list(dict.fromkeys(cfg.fedmkt.clients))
    return {"hetero": distinct, "hetero2": distinct[:2]}.get(setting, distinct[:1])


def holders(cfg: Any, setting: str, run_dir: Path) -> dict[str, list[str]]:
    """SLM name -> the clients of a FedMKT run that hold it."""
    from fedtune.report.io import read_config

    saved = read_config(run_dir)
    names = saved["fedmkt"]["clients"]
    count = saved["data"]["partition"]["num_clients"]
    out: dict[str, list[str]] = {}
    for index in range(count):
        out.setdefault(names[index % len(names)], []).append(f"c{index:02d}")
    return out


def model_scores(row: dict[str, Any], held: dict[str, list[str]], metric: str) -> dict[str, float]:
    """A metrics row's LLM score and each SLM's (the mean over the clients holding it, ``held``)."""
    out = {"llm": float(row["eval"][metric])} if metric in row.get("eval", {}) else {}
    by_client = row.get("eval_by_client", {})
    for name, clients in held.items():
        values = [by_client[c][metric] for c in clients if metric in by_client.get(c, {})]
        if values:
            out[name] = float(np.mean(values))
    return out


def row_of(name: str) -> str:
    """The table row of a run name without its seed: ``<dataset>-<setting>-<row>``, or a run the settings
    share, ``<dataset>-centralized-<model>`` (row ``centralized``) and ``<dataset>-llmpublic``."""
    return "centralized" if "-centralized-" in name else name.rsplit("-", 1)[-1]


def own_lr(name: str, own: Mapping[str, float] | None) -> float | None:
    """The lr ``own`` (``--row-lr``) gives run ``name`` (see `row_of`): a Centralized run's model's own
    (``centralized-<model>``, one run a model) before its row's; None where it gives neither (the
    config's lr)."""
    given = own or {}
    if "-centralized-" in name:
        model = f"centralized-{name.split('-centralized-', 1)[1]}"
        if model in given:
            return given[model]
    return given.get(row_of(name))


def own_llm_lr(name: str, own: Mapping[str, float] | None) -> float | None:
    """The lr ``own`` (``--row-lr fedmkt-llm=``) gives the LLM of FedMKT run ``name`` apart from its SLMs;
    None where it gives none (the LLM trains at the row's lr, as the SLMs do) or the run is no FedMKT
    run (in the other rows the LLM does not learn, or trains alone at its row's lr)."""
    return (own or {}).get(FEDMKT_LLM) if row_of(name) == "fedmkt" else None


def run_path(root: Path, name: str, seed: int | str, own: Mapping[str, float] | None = None) -> Path:
    """The run directory of run ``name`` (see `row_of`) for ``seed``: ``<name>-s<seed>``, or
    ``<name>-lr<lr>-s<seed>`` where ``own`` (``--row-lr``) gives the run its lr (`own_lr`), with
    ``-llmlr<lr>`` after the name where it gives a FedMKT run's LLM its own (`own_llm_lr`)."""
    lr, llm = own_lr(name, own), own_llm_lr(name, own)
    stem = name if llm is None else f"{name}-llmlr{llm:g}"
    return root / f"{stem if lr is None else f'{stem}-lr{lr:g}'}-s{seed}"


def run_row(key: str) -> str:
    """The row of a run directory's key (its name without the row's lr and the seed: `run_name_parts`),
    a FedMKT run whose LLM has an lr of its own included."""
    return row_of(LLM_LR_STEM.sub("", key))


@dataclass(frozen=True)
class Runs:
    """One dataset and setting's runs, as a table reads them: where they lie (``root``, the table's runs
    directory), the seeds, the dataset's metric, and the rows at their own lr (``own``, ``--row-lr``)."""

    root: Path
    dataset: str
    setting: str
    seeds: list[int]
    metric: str
    own: Mapping[str, float] = field(default_factory=dict)

    def path(self, name: str, seed: int | str) -> Path:
        """The run directory of ``<dataset>-<name>`` for ``seed`` (`run_path`)."""
        return run_path(self.root, f"{self.dataset}-{name}", seed, self.own)
