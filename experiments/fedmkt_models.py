"""FedMKT's models, shared by its table (`experiments/fedmkt_table.py`) and its trajectory over rounds
(`experiments/fedmkt_rounds.py`): the SLMs a setting holds and which clients hold each, the metric of a
dataset, a metrics row's score of the LLM and of each SLM, and the colour of each model in the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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
