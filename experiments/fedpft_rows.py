"""FedPFT's rows, shared by its table (`experiments/fedpft_table.py`) and its learning-rate sweep
(`experiments/fedpft_lr.py`): what defines each row, dataset and partition, their labels, and a row's
runs summarised over seeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments import tables

ROWS: dict[str, list[str]] = {
    # FedOT as Offsite-tuning builds its emulator: layer drop, then distillation with FedPFT's budget
    # (the config's distill_steps, distill_lr and public set); "fedot" is the undistilled ablation.
    "fedot_kd": ["fedpft.submodel=layerdrop", "fedpft.neuron_every=0"],
    "fedot": ["fedpft.submodel=layerdrop", "fedpft.distill_steps=0", "fedpft.neuron_every=0"],
    "fedpft": [],
    "fedpetuning": ["fedpft.submodel=full", "fedpft.distill_steps=0", "fedpft.neuron_every=0"],
    "no_layer": ["fedpft.distill_steps=0"],
    "no_neuron": ["fedpft.neuron_every=0"],
    "fedpft_rel": ["fedpft.hidden_loss=token_relative"],
    "fedot_emu": [
        "fedpft.submodel=layerdrop",
        "fedpft.emulator_lora=true",
        "fedpft.distill_steps=0",
        "fedpft.neuron_every=0",
    ],
}
ON_DEMAND = ("fedpft_rel", "fedot_emu")
"""Rows run only when named: an option for decoders, and FedOT's variant with LoRA on the emulator."""
LABELS = {
    "fedot_kd": "FedOT (layer drop + distillation)",
    "fedot": "FedOT (layer drop)",
    "fedpft": "FedPFT",
    "fedpetuning": "FedPETuning (full model)",
    "no_layer": "FedPFT w/o layer-level distillation",
    "no_neuron": "FedPFT w/o neuron-level distillation",
    "fedpft_rel": "FedPFT, token-relative distillation",
    "fedot_emu": "FedOT, LoRA on the emulator's layers too",
}
DATASETS: dict[str, list[str]] = {
    "lexclass": ["data.dataset=wordnet-lexclass"],
    "wic": ["data.dataset=wordnet-wic"],
    "hypernym": ["data.dataset=wordnet-hypernym-yn"],
}
PARTITIONS: dict[str, list[str]] = {
    "iid": ["data.partition.scheme=iid"],
    **{
        f"dir{alpha}": [
            "data.partition.scheme=dirichlet",
            f"data.partition.alpha={alpha}",
            "data.partition.by=output",
        ]
        for alpha in (1, 5, 10)
    },
}


def row_overrides(row: str, suffix: str) -> list[str]:
    """What defines a run of ``row`` on ``suffix`` (``<dataset>-<partition>``): the row's keys, then the
    dataset's and the partition's (``--set`` goes before them, `tables.plan`: ``--set
    fedpft.distill_steps=1000`` sets FedPFT's distillation and FedOT's emulator's, and leaves the rows
    without one at ``distill_steps=0``)."""
    data, part = suffix.split("-")
    return [*ROWS[row], *DATASETS[data], *PARTITIONS[part]]


def summarise(run_dirs: list[Path]) -> dict[str, Any]:
    """Final accuracies over seeds; parameters, memory and traffic of the first finished seed."""
    finals: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[int, float]] = {}
    first: tuple[Path, list[Any]] | None = None  # the first finished run and its rows
    for run_dir in run_dirs:
        rows = tables.finished_rows(run_dir)
        final = tables.last_evaluated(rows, "accuracy")
        if final is not None:
            first = first or (run_dir, rows)
            finals[tables.seed_of(run_dir)] = final["eval"]
            curves[tables.seed_of(run_dir)] = {
                r["round"]: 100 * r["eval"]["accuracy"]
                for r in tables.trained_rows(rows)
                if "accuracy" in (r.get("eval") or {})
            }
    out: dict[str, Any] = {"seeds": len(finals)}
    if first is None:
        return out
    out |= tables.seed_values(finals, ("accuracy", "macro_f1", "sub/accuracy"), scale=100)
    evaluated = sorted(set.intersection(*(set(curve) for curve in curves.values())))
    out["accuracy_by_round"] = {  # the mean over seeds at each round every finished seed evaluated
        str(rnd): tables.mean_std(curve[rnd] for curve in curves.values())[0] for rnd in evaluated
    }
    out["constant"] = all(one_class_on_two(m["accuracy"], m["macro_f1"]) for m in finals.values())
    done, done_rows = first
    rounds = tables.trained_rows(done_rows)
    out["mb_up_per_round"] = tables.per_round_mb(rounds, "bytes_up")
    out["mb_down_per_round"] = tables.per_round_mb(rounds, "bytes_down")
    out["peak_rss_mb"] = max(float(r.get("peak_rss_mb", 0.0)) for r in rounds)
    lr = tables.run_lr(done)
    if lr is not None:
        out["lr"] = lr
    info = done / "artifacts" / "fedpft.json"
    if info.is_file():
        saved = json.loads(info.read_text())
        out["params"] = saved["params"]
        out["distill_seconds"] = [round(d["seconds"], 1) for d in saved["distillation"]]
    return out


def one_class_on_two(accuracy: float, macro_f1: float) -> bool:
    """Whether a 2-class model predicts one class only: its macro-F1 is then acc / (1 + acc) exactly
    (F1 = 2 acc / (1 + acc) on the predicted class, 0 on the other)."""
    return 0 < accuracy < 1 and abs(macro_f1 - accuracy / (1 + accuracy)) < 1e-9


def suffixes_of(args: Any) -> list[str]:
    return [f"{data}-{part}" for data in args.datasets for part in args.partitions]
