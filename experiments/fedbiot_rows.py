"""FedBiOT's rows, shared by its table (`experiments/fedbiot_table.py`) and its side studies (the ablation,
`experiments/fedbiot_ablation.py`, and the initial distillation sweep, `experiments/fedbiot_init.py`): what
defines each method's run, their labels, the metric a table leads with, and how the runs start."""

from __future__ import annotations

from typing import Any

from experiments import tables

# The baselines distil their emulator with their own objective, not FedBiOT's eq. (2): Offsite-tuning's
# (and FederatedScope's FedOT) is a relative hidden-state MSE plus the LM loss. fedtune has the MSE
# (normalised by the teacher's mean square) but not the LM term, so they run with the MSE alone: without
# FedBiOT's KL term (align_lambda 0), which the paper's baselines never had.
OFFSITE = [
    "fedbiot.split=first_last",
    "fedbiot.adapter_layers=4",
    "fedbiot.align_steps=0",
    "fedbiot.prox_eps=0",
    "fedbiot.align_lambda=0",
]
METHODS: dict[str, list[str]] = {
    "offsite": [*OFFSITE, "fed.mode=centralized"],
    "fedot": OFFSITE,
    "fedbiot_a2": ["fedbiot.split=last", "fedbiot.adapter_layers=2"],
    "fedbiot_a4": ["fedbiot.split=last", "fedbiot.adapter_layers=4"],
}
LABELS = {
    "offsite": "Offsite-tuning",
    "fedot": "FedOT",
    "fedbiot_a2": "FedBiOT (Adapter 2)",
    "fedbiot_a4": "FedBiOT (Adapter 4)",
}


def primary_metric(cfg: Any) -> str:
    generation = [m for m in cfg.eval.metrics if m != "perplexity"]
    return generation[0] if generation else "perplexity"


def start(args: Any, runs: tables.Plan) -> None:
    """Run ``runs`` one after another (a run takes every core), unless ``--table-only``: runs that differ
    only in what the initial emulator distillation does not depend on (method rows sharing a split, eps,
    seeds of other steps) share it through a cache beside them."""
    if args.table_only:
        return
    for run_dir, overrides in runs.runs.items():
        shared = f"fedbiot.init_cache={run_dir.parent / 'emulator-init'}"
        tables.run(args.config, [shared, *overrides], run_dir, threads=None)
