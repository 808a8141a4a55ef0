"""FedBiOT's initial emulator distillation, beside its table (``--init-sweep I_0 ...``): how many steps it
needs. For each I_0 (FedBiOT adapter 2 at each of ``--dropouts``, default 0.5 there) a one-round run
evaluated before round 1 (right after the distillation: the adapter is still the pretrained layers, so
AdapFu is the base model) and after it, perplexity only (``sweep-i0-<config name>``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments import tables
from experiments.fedbiot_rows import METHODS, start

INIT_SWEEP = ["fed.rounds=1", "eval.before=true", "eval.every=1", "eval.metrics=[perplexity]"]


def init_sweep(args: Any, cfg: Any, base: Path, command: str) -> None:
    a2 = METHODS["fedbiot_a2"]
    rows = {
        f"{steps}-d{d}": [*a2, f"fedbiot.dropout={d}", f"fedbiot.init_steps={steps}", *INIT_SWEEP]
        for d in args.dropouts or [0.5]
        for steps in args.init_sweep
    }
    runs = tables.plan(base, rows, args.seeds, args.set, stems={key: f"i0-{key}" for key in rows})
    start(args, runs)
    results = {key: init_summary(paths) for key, paths in runs.dirs.items()}
    text = init_sweep_text(cfg, args, results, command)
    tables.write_table(args.results_dir / f"sweep-i0-{cfg.name}", text, cfg.name, command, results, args)


def init_sweep_text(cfg: Any, args: Any, results: dict[str, Any], command: str) -> str:
    """The initial distillation's table: per I_0 and dropout, perplexity after it and after round 1."""
    keys = [(d, steps) for d in args.dropouts or [0.5] for steps in args.init_sweep]
    rows = [
        [
            str(steps),
            f"{d:g}",
            tables.cell(r.get("after_init/adapemu"), 1),
            tables.cell(r.get("after_init/adapfu"), 2),
            tables.cell(r.get("round1/adapemu"), 1),
            tables.cell(r.get("round1/adapfu"), 2),
            tables.cell(r.get("init_mse"), 3),
            str(r["seeds"]),
        ]
        for d, steps in keys
        for r in [results[f"{steps}-d{d}"]]
    ]
    header = ["I_0", "dropout", "AdapEmu ppl after I_0", "AdapFu ppl (base)", "AdapEmu ppl, round 1"]
    return "\n".join(
        [
            f"# {cfg.name}: the initial emulator distillation's length (FedBiOT adapter 2)",
            "",
            f"`{command}`",
            "",
            "Perplexity on the test answers (lower is better), right after the I_0 steps of eq. (2) on the "
            "public set and after one round of training; mean ± std over seeds. Distillation MSE: eq. (2)'s "
            "normalised hidden-state term, averaged over the I_0 steps.",
            "",
            tables.markdown_table([*header, "AdapFu ppl, round 1", "distillation MSE", "seeds"], rows),
        ]
    )


def render_init_sweep(recorded: tables.Recorded) -> str:
    return init_sweep_text(recorded.cfg, recorded.args, recorded.results, recorded.command)


def init_summary(run_dirs: list[Path]) -> dict[str, Any]:
    """Per seed: AdapEmu / AdapFu perplexity after the initial distillation (round 0) and after round
    1, and the distillation's mean normalised hidden-state MSE (from the run's fedbiot.json)."""
    out: dict[str, Any] = {"seeds": 0}
    for run_dir in run_dirs:
        rows = {int(r["round"]): r.get("eval", {}) for r in tables.finished_rows(run_dir) if "eval" in r}
        if 0 not in rows or 1 not in rows:
            continue
        seed = tables.seed_of(run_dir)
        out["seeds"] += 1
        for when, rnd in (("after_init", 0), ("round1", 1)):
            for model in ("adapemu", "adapfu"):
                out.setdefault(f"{when}/{model}", {})[seed] = rows[rnd][f"{model}/perplexity"]
        info = json.loads((run_dir / "artifacts" / "fedbiot.json").read_text())
        mse = info.get("initial_distillation", {}).get("mse")
        if mse is not None:
            out.setdefault("init_mse", {})[seed] = float(mse)
    return out
