"""FedBiOT's rows, shared by its table (`experiments/fedbiot_table.py`) and its side studies (the ablation,
`experiments/fedbiot_ablation.py`, and the initial distillation sweep, `experiments/fedbiot_init.py`): what
defines each method's run, their labels, the metric a table leads with, and how the runs start."""

from __future__ import annotations

from typing import Any

from experiments import tables

# The baselines distil their emulator with their own objective, not FedBiOT's eq. (2): Offsite-tuning's
# (and FederatedScope's FedOT) is a relative hidden-state MSE plus the LM loss, weighed KD 30 : LM 1 in
# Offsite-tuning's scripts. "offsite" and "fedot" (the committed tables' rows) take the MSE alone, without
# FedBiOT's KL term (align_lambda 0), which the papers' baselines never had; "offsite_lm" and "fedot_lm"
# add the LM term at that weight (align_lm 1/30 beside the MSE): the baselines as their papers build them.
OFFSITE = [
    "fedbiot.split=first_last",
    "fedbiot.adapter_layers=4",
    "fedbiot.align_steps=0",
    "fedbiot.prox_eps=0",
    "fedbiot.align_lambda=0",
]
LM_TERM = "fedbiot.align_lm=0.033"
METHODS: dict[str, list[str]] = {
    "offsite": [*OFFSITE, "fed.mode=centralized"],
    "fedot": OFFSITE,
    "offsite_lm": [*OFFSITE, LM_TERM, "fed.mode=centralized"],
    "fedot_lm": [*OFFSITE, LM_TERM],
    "fedbiot_a2": ["fedbiot.split=last", "fedbiot.adapter_layers=2"],
    "fedbiot_a4": ["fedbiot.split=last", "fedbiot.adapter_layers=4"],
}
LABELS = {
    "offsite": "Offsite-tuning",
    "fedot": "FedOT",
    "offsite_lm": "Offsite-tuning (+LM)",
    "fedot_lm": "FedOT (+LM)",
    "fedbiot_a2": "FedBiOT (Adapter 2)",
    "fedbiot_a4": "FedBiOT (Adapter 4)",
}
COLOURS = {
    "offsite": "#2ca02c",
    "fedot": "#ff7f0e",
    "offsite_lm": "#8c564b",
    "fedot_lm": "#e377c2",
    "fedbiot_a2": "#1f77b4",
    "fedbiot_a4": "#9467bd",
}
"""Each method's colour in the plots that draw one line per method."""
BASELINES = ("offsite", "fedot", "offsite_lm", "fedot_lm")
ON_DEMAND = ("offsite_lm", "fedot_lm")
"""Rows run only when ``--methods`` names them (the default is the committed tables' four)."""


def primary_metric(cfg: Any) -> str:
    generation = [m for m in cfg.eval.metrics if m != "perplexity"]
    return generation[0] if generation else "perplexity"


def start(args: Any, runs: tables.Plan) -> None:
    """Run ``runs``, ``--jobs`` at a time (one thread each; one job alone takes every core), unless
    ``--table-only``: runs that differ only in what the initial emulator distillation does not depend on
    (method rows sharing a split, eps, seeds of other steps) share it through a cache beside them, and
    of those started together one distils while the others wait for it."""
    jobs = int(getattr(args, "jobs", 1))
    shared = {
        run_dir: [f"fedbiot.init_cache={run_dir.parent / 'emulator-init'}", *overrides]
        for run_dir, overrides in runs.runs.items()
    }
    tables.start(args, shared, jobs=jobs, threads=None if jobs == 1 else 1)
