"""FedPT's rows, shared by its table (`experiments/fedpt_table.py`) and its small-model study
(`experiments/fedpt_small.py`): what defines each method's run, their labels, and the test sets a table
shows."""

from __future__ import annotations

from typing import Any

METHODS: dict[str, list[str]] = {
    "fedavg_small": ["algorithm=fedit", "fedpt=null"],
    "fedavg_large": ["algorithm=fedit", "fedpt=null", "model.name={large}", "eval.before=true"],
    "fedavg_pt": ["fedpt.distill=false"],
    "fedpt": [],
}
LABELS = {
    "base_large": "Base (large)",
    "fedavg_small": "FedAvg (small)",
    "fedavg_large": "FedAvg (large)",
    "fedavg_pt": "FedAvg+PT",
    "fedpt": "FedPT",
}


def method_overrides(method: str, cfg: Any) -> list[str]:
    return [item.format(large=cfg.fedpt.large_model) for item in METHODS[method]]


def run_overrides(method: str, cfg: Any, extra: list[str]) -> list[str]:
    """A method's run: ``extra`` (``--set``) first, then what defines the method, which wins over it
    (``--set model.name=<another small model>`` leaves FedAvg (large) on the large model)."""
    return [*extra, *method_overrides(method, cfg)]


def test_sets(cfg: Any) -> list[tuple[str, str]]:
    """(label, metric prefix) per test set: the primary one, then ``eval.extra_datasets``."""
    primary = cfg.data.eval_dataset or cfg.data.dataset
    return [(primary, "")] + [(name, f"{name}/") for name in cfg.eval.extra_datasets]
