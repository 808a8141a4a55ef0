"""FedPT's Table 1 at small scale: the five methods of the paper on one config, side by side.

    python experiments/fedpt_table.py configs/paper/fedpt-smollm2.yaml  # run what is missing, tabulate
    python experiments/fedpt_table.py configs/paper/fedpt-smollm2.yaml --table-only
    python experiments/fedpt_table.py configs/paper/fedpt-smollm2.yaml --seeds 0 1 2 --jobs 2  # 3 seeds

Methods (each a normal run directory under ``--runs-dir/<config name>/<method>``):
- ``fedavg_small``: FedIT on the small model (``algorithm=fedit fedpt=null``);
- ``fedavg_large``: FedIT on the large model (``algorithm=fedit fedpt=null model.name=<fedpt.large_model>``),
  evaluated before training too: its round 0 is **Base (large)**;
- ``fedavg_pt``: FedPT without the distillation step (``fedpt.distill=false``);
- ``fedpt``: FedPT.
A training seed other than the config's runs under ``<method>-s<seed>`` with ``seed=<seed>`` (client
sampling, data order, LoRA init); the config's own seed keeps ``<method>``. With one training seed a
cell's ± is the std over the evaluation's sampling seeds; with several it is the std over the training
seeds of each one's mean over its sampling seeds, and each ordering says in how many training seeds it
holds. ``--keep-earlier``: a seed whose run is not in ``--runs-dir`` (made on another machine) takes the
value the table's previous results file recorded for it, and the table names each seed so kept.
Every run is a subprocess (``python -m fedtune run``, its output in ``<run dir>.log``), so a crash or
an out-of-memory kill loses only that method; rerunning resumes unfinished runs and skips finished ones.

Each method at its own lr: ``--lrs 3e-4 1e-3 3e-3`` runs every ``--methods`` row at each lr on the
validation split (the test split is not read; `experiments.tables.search`), ranked by Rouge-L (perplexity
where the runs score no Rouge-L), and writes ``sweep-lr-<config name>``, whose last line is the
``--row-lr METHOD=LR ...`` that runs the table so (run directories ``<method>-lr<lr>[-s<seed>]``; the
table names each such row's lr).

Client memory is measured in a fresh process per client model (`experiments.fedpt_memory`); the
small-model study (``--small-models``) is `experiments.fedpt_small`. Bytes are the totals over the run
from ``metrics.jsonl`` (up + down, all clients, all rounds).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import now

from experiments import fedpt_small, tables
from experiments.fedpt_memory import measure_client
from experiments.fedpt_rows import LABELS, METHODS, method_overrides, run_overrides, test_sets
from experiments.tables import layout, search


def total_mb(rows: list[dict[str, Any]]) -> float:
    return sum(row.get("bytes_up", 0) + row.get("bytes_down", 0) for row in rows) / 2**20


def seed_run_dir(root: Path, method: str, seed: int, cfg: Any) -> Path:
    """A method's run for one training seed: ``<method>`` for the config's seed, else ``<method>-s<seed>``."""
    return root / (method if seed == cfg.seed else f"{method}-s{seed}")


def seed_overrides(seed: int, cfg: Any) -> list[str]:
    return [] if seed == cfg.seed else [f"seed={seed}"]


def over_training_seeds(by_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One evaluation from each training seed's (seed -> eval): one seed's as it is (its ``_std`` are over
    sampling seeds); several: each metric's mean and, as ``_std``, its std over the training seeds, and
    ``<metric>_by_seed``. The alpha study (validation, per seed) is kept only for one seed."""
    if len(by_seed) == 1:
        return dict(next(iter(by_seed.values())))
    seeds = sorted(by_seed, key=int)
    keys = [k for k in by_seed[seeds[0]] if not k.endswith("_std") and not k.startswith("alpha_study/")]
    combined: dict[str, Any] = {}
    for key in keys:
        values = {seed: by_seed[seed][key] for seed in seeds if key in by_seed[seed]}
        if key == "alpha":
            combined["alpha_by_seed"] = values
        elif len(values) == len(seeds):
            combined.update(tables.over_seeds(key, values))
    return combined


def earlier_seed(entry: dict[str, Any] | None, seed: str) -> dict[str, Any] | None:
    """One training seed's evaluation as an earlier results file recorded it (``entry``: a method's
    results): the whole evaluation when that file had this seed alone, else each ``<key>_by_seed``
    value (and alpha) of this seed; None when the file has no value for it."""
    if not entry or seed not in entry.get("training_seeds", []):
        return None
    evaluation = entry["eval"]
    if entry["training_seeds"] == [seed]:
        return dict(evaluation)
    return tables.seed_slice(evaluation, seed)  # alpha_by_seed -> alpha, rougeL_by_seed -> rougeL


def tabulate(
    cfg: Any,
    runs: dict[str, dict[int, Path]],
    memory: dict[str, dict[str, float]],
    earlier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per method (and Base (large), FedAvg (large)'s round 0): the final evaluation over the training
    seeds whose run finished (``over_training_seeds``), the client model, bytes and memory. With
    ``earlier`` (``--keep-earlier``: the table's previous results), a seed whose run is not here takes
    the value recorded there, and the entry's ``kept_seeds`` names it."""
    earlier = earlier or {}
    results: dict[str, dict[str, Any]] = {}
    base: dict[str, dict[str, Any]] = {}
    kept_base: list[str] = []
    for method, seed_runs in runs.items():
        finals: dict[str, dict[str, Any]] = {}
        mbs: list[float] = []
        kept: list[str] = []
        for seed, path in seed_runs.items():
            method_rows = tables.finished_rows(path)
            final = tables.last_evaluated(method_rows)
            if final is None:
                recorded = earlier_seed(earlier.get(method), str(seed))
                if recorded is not None:
                    finals[str(seed)] = recorded
                    mbs.append(earlier[method]["total_mb"])
                    kept.append(str(seed))
                    base_recorded = earlier_seed(earlier.get("base_large"), str(seed))
                    if method == "fedavg_large" and base_recorded is not None:
                        base[str(seed)] = base_recorded
                        kept_base.append(str(seed))
                continue
            finals[str(seed)] = final["eval"]
            mbs.append(total_mb(method_rows))
            if method == "fedavg_large" and method_rows[0].get("eval"):
                base[str(seed)] = method_rows[0]["eval"]
        if not finals:
            continue
        client_model = cfg.fedpt.large_model if method == "fedavg_large" else cfg.model.name
        results[method] = {
            "eval": over_training_seeds(finals),
            "training_seeds": sorted(finals, key=int),
            "client_model": client_model,
            "total_mb": sum(mbs) / len(mbs),
            "rounds": cfg.fed.rounds,
            "memory": memory.get(client_model, {}),
            **({"kept_seeds": kept} if kept else {}),
        }
    if base:
        entry = {"eval": over_training_seeds(base), "training_seeds": sorted(base, key=int)}
        entry |= {"kept_seeds": kept_base} if kept_base else {}
        results = {"base_large": {**entry, "client_model": "-", "total_mb": 0.0}, **results}
    return results


def spread(evaluation: dict[str, Any], key: str) -> float:
    """The std of ``key``: over the training seeds (the sample std of ``<key>_by_seed``, whatever std the
    results file recorded) where there are several, else the recorded one (over the sampling seeds)."""
    by_seed = evaluation.get(f"{key}_by_seed")
    return tables.mean_std(by_seed.values())[1] if by_seed else evaluation.get(f"{key}_std", 0.0)


def spread_cell(evaluation: dict[str, Any], key: str, digits: int) -> str:
    """``mean ± std`` of ``key`` (`spread`); ``-`` where there is no ``key``."""
    if key not in evaluation:
        return "-"
    has_std = f"{key}_by_seed" in evaluation or f"{key}_std" in evaluation
    return tables.plus_minus(evaluation[key], spread(evaluation, key) if has_std else None, digits)


ORDER = ("base_large", "fedavg_small", "fedavg_large", "fedavg_pt", "fedpt")


def columns(sets: list[tuple[str, str]]) -> list[layout.Column[layout.Entry]]:
    """The table's columns: the client model, its memory and traffic, Rouge-L per test set, Dist-n, test
    perplexity per test set."""

    def memory(res: dict[str, Any]) -> dict[str, float]:
        return res.get("memory") or {}

    def metric(header: str, key: str, digits: int = 4) -> layout.Column[layout.Entry]:
        return layout.Column(header, lambda entry: spread_cell(entry[1]["eval"], key, digits))

    return [
        layout.Column("method", lambda entry: LABELS[entry[0]]),
        layout.Column("client model", lambda entry: entry[1]["client_model"]),
        layout.Column("client params", lambda e: f"{memory(e[1])['params_m']:.1f}M" if memory(e[1]) else "-"),
        layout.Column(
            "client peak RSS (batch 1)",
            lambda e: f"{memory(e[1])['peak_rss_mb']:.0f} MB" if memory(e[1]) else "-",
        ),
        layout.Column("total comm.", lambda e: f"{e[1]['total_mb']:.1f} MB" if e[1]["total_mb"] else "-"),
        *(metric(f"Rouge-L {label}", prefix + "rougeL") for label, prefix in sets),
        metric("Dist-3", "dist3"),
        metric("Dist-4", "dist4"),
        *(metric(f"test ppl {label}", prefix + "perplexity", 2) for label, prefix in sets),
    ]


def markdown(cfg: Any, results: dict[str, Any], command: str, stamp: str | None = None) -> str:
    """The table; ``stamp``: the time it was made (None: now)."""
    sets = test_sets(cfg)
    seeds = max((len(res.get("training_seeds", [])) for res in results.values()), default=0)
    counts = {LABELS[m]: len(results[m].get("training_seeds", [])) for m in ORDER if m in results}
    spread = seed_caption(counts)
    lines = [
        f"# FedPT Table 1 structure: `{cfg.name}`",
        "",
        f"`{command}` — {stamp or now()}",
        "",
        f"Rouge-L and Dist-n: {spread}. Test ppl: deterministic perplexity of the method's output model "
        "on the test set's references.",
        "",
        layout.table(columns(sets), [(m, results[m]) for m in ORDER if m in results]),
    ]
    note = ordering_note(results, sets)
    lines += ["", note] if note else []
    own = [f"{LABELS[m]} {results[m]['lr']:g}" for m in ORDER if results.get(m, {}).get("lr") is not None]
    if own:
        lines += [
            "",
            f"Rows at their own lr (`--row-lr`; the others at the config's {cfg.train.lr:g}): "
            f"{', '.join(own)}.",
        ]
    kept = [
        f"{LABELS[m]} seed {', '.join(r['kept_seeds'])}" for m, r in results.items() if r.get("kept_seeds")
    ]
    if kept:
        lines += ["", f"From the previous results file (runs not here, `--keep-earlier`): {'; '.join(kept)}."]
    if seeds > 1:
        lines += ["", "Rouge-L per training seed:", "", *per_seed_table(results, sets)]
    for method in ("fedavg_pt", "fedpt"):
        alphas = results.get(method, {}).get("eval", {}).get("alpha_by_seed")
        if alphas:
            chosen = ", ".join(f"seed {seed}: {alpha}" for seed, alpha in alphas.items())
            lines += ["", f"alpha chosen on validation ({LABELS[method]}): {chosen}"]
        study = {
            k.split("/", 1)[1]: v
            for k, v in results.get(method, {}).get("eval", {}).items()
            if k.startswith("alpha_study/")
        }
        if study:
            lines += [
                "",
                f"alpha study ({LABELS[method]}, validation {search_metric(cfg)}): "
                + ", ".join(f"alpha {a}: {v:.4f}" for a, v in study.items())
                + f" -> alpha {results[method]['eval'].get('alpha')}",
            ]
    return "\n".join(lines) + "\n"


def seed_caption(counts: dict[str, int]) -> str:
    """What a cell's ``±`` is, given each row's number of training seeds: one count for the whole table
    where the rows agree, else each row's count."""
    each_seed = "each seed: the mean over its sampling seeds"
    lone = "one training seed; ± is the std over the evaluation's sampling seeds"
    if len(set(counts.values())) <= 1:
        count = next(iter(counts.values()), 0)
        return f"mean ± std over {count} training seeds ({each_seed})" if count > 1 else lone
    each = "; ".join(f"{label}: {count}" for label, count in counts.items())
    text = f"mean ± std over each row's training seeds ({each}; {each_seed})"
    return text + (f"; a row with {lone}" if 1 in counts.values() else "")


def search_metric(cfg: Any) -> str:
    """What the alpha search picked by, as the run's server does (`fedpt.alpha_search_metric`)."""
    metric = cfg.fedpt.search_metric(cfg.eval.metrics)
    if metric == "perplexity":
        return "perplexity"
    seeds = cfg.fedpt.alpha_search_seeds
    return f"{'Rouge-L' if metric == 'rougeL' else metric}, {seeds} sampling seed{'' if seeds == 1 else 's'}"


def per_seed_table(results: dict[str, Any], sets: list[tuple[str, str]]) -> list[str]:
    """Each method's Rouge-L per training seed, a column per seed and test set."""
    seeds = sorted({s for res in results.values() for s in res.get("training_seeds", [])}, key=int)

    def rouge(label: str, prefix: str, seed: str) -> layout.Column[layout.Entry]:
        def cell(entry: layout.Entry) -> str:
            evaluation = entry[1]["eval"]
            by_seed = evaluation.get(f"{prefix}rougeL_by_seed", {})
            if entry[1].get("training_seeds") == [seed] and f"{prefix}rougeL" in evaluation:
                by_seed = {seed: evaluation[f"{prefix}rougeL"]}  # a one-seed row keeps no _by_seed fields
            return f"{by_seed[seed]:.4f}" if seed in by_seed else "-"

        return layout.Column(f"{label} s{seed}", cell)

    columns: list[layout.Column[layout.Entry]] = [layout.Column("method", lambda entry: LABELS[entry[0]])]
    columns += [rouge(label, prefix, seed) for label, prefix in sets for seed in seeds]
    return layout.table(columns, [(m, results[m]) for m in ORDER if m in results]).splitlines()


def ordering_note(results: dict[str, Any], sets: list[tuple[str, str]]) -> str:
    """Does the paper's ordering Base(large) < FedAvg(small) <= FedAvg+PT <= FedPT ~ FedAvg(large) hold?"""
    notes = []
    for label, prefix in sets:
        score = {m: r["eval"].get(prefix + "rougeL", math.nan) for m, r in results.items()}
        std = {m: spread(r["eval"], prefix + "rougeL") for m, r in results.items()}
        checks = [
            ("base_large", "fedavg_small", "<"),
            ("fedavg_small", "fedavg_pt", "<="),
            ("fedavg_pt", "fedpt", "<="),
            ("fedpt", "fedavg_large", "~"),
        ]
        parts = []
        for a, b, relation in checks:
            if a not in score or b not in score:
                continue
            gap = score[b] - score[a]
            noise = math.hypot(std.get(a, 0.0), std.get(b, 0.0))
            if relation == "<":
                verdict = tables.verdict([score[a], score[b]])
            else:
                holds = abs(gap) <= max(noise, 0.01) * 2 if relation == "~" else gap >= -noise
                verdict = "holds" if holds else "does not hold"
            count = ""
            columns = [results[m]["eval"].get(f"{prefix}rougeL_by_seed") for m in (a, b)]
            if relation != "~" and all(columns):
                held, total = tables.seeds_holding(columns, strict=relation == "<")  # type: ignore[arg-type]
                count = f"; in {held} of {total} training seeds"
            if all(columns):  # "~" too: its interval says whether the larger row is ahead beyond the noise
                names = [LABELS[a], LABELS[b]] if relation == "~" else ()
                count += "; " + tables.claim_text(columns, names, digits=4)  # type: ignore[arg-type]
            parts.append(f"{LABELS[a]} {relation} {LABELS[b]}: {verdict} ({gap:+.4f}{count})")
        if parts:
            notes.append(f"- {label}: " + "; ".join(parts))
    if not notes:  # fewer methods than any ordering compares (--methods fedpt)
        return ""
    return "Paper ordering (Rouge-L; `<=` allows one combined std of slack, `~` two):\n" + "\n".join(notes)


def render_table(recorded: tables.Recorded) -> str:
    return markdown(recorded.cfg, recorded.results, recorded.command, tables.stamp_of(recorded))


def search_score(cfg: Any) -> search.Score:
    """What the lr search ranks by: Rouge-L on the primary test set where the runs score it (x 100), else
    perplexity."""
    if "rougeL" in cfg.eval.metrics:
        return search.Score("rougeL", "Rouge-L (x 100)", lower_is_better=False, scale=100.0)
    return search.Score("perplexity", "perplexity", lower_is_better=True)


def render_search(recorded: tables.Recorded) -> str:
    args = recorded.args
    found = search.Search(
        recorded.cfg, args.methods, args.lrs, search_score(recorded.cfg), LABELS.__getitem__, str
    )
    return search.render_search(recorded, found)


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__, keep_earlier=True)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--no-memory", action="store_true", help="skip the client memory probes")
    parser.add_argument(
        "--small-models",
        nargs="+",
        metavar="MODEL",
        help="the small-model study: FedAvg (small) and FedPT with each client model (study-small-<name>)",
    )
    tables.row_lr_option(parser, "fedavg_small=0.003")
    search.lrs_option(parser)
    args = tables.parse_args(parser, argv)
    if args.render:
        renderers = {
            "table-": render_table,
            "study-small-": fedpt_small.render_study,
            search.PREFIX: render_search,
        }
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    own = search.own_lrs(parser, args, METHODS)
    cfg = tables.load_config(args)
    if args.lrs:
        rows = {m: method_overrides(m, cfg) for m in args.methods}
        score = search_score(cfg)
        summarise = search.final_values(score.key)
        command = tables.command_line(__file__, argv)
        found = search.Search(cfg, list(rows), args.lrs, score, LABELS.__getitem__, str)
        search.lr_search(args, found, args.runs_dir / cfg.name, rows, command, summarise)
        return
    if args.small_models:
        if args.seeds != [cfg.seed]:
            parser.error(f"--small-models runs the config's seed ({cfg.seed}) only; drop --seeds")
        fedpt_small.small_model_study(args, cfg, tables.command_line(__file__, argv))
        return
    root = args.runs_dir / cfg.name
    stems = {m: tables.lr_stem(m, own[m]) if m in own else m for m in args.methods}
    runs = {m: {seed: seed_run_dir(root, stems[m], seed, cfg) for seed in args.seeds} for m in args.methods}
    overrides = {
        run_dir: [
            *run_overrides(m, cfg, [*args.set, *seed_overrides(seed, cfg)]),
            *([tables.lr_override(own[m])] if m in own else []),
        ]
        for m, seed_runs in runs.items()
        for seed, run_dir in seed_runs.items()
    }
    tables.start(args, overrides, threads=None if args.jobs == 1 else 1)
    memory: dict[str, dict[str, float]] = {}
    if not args.no_memory:
        for model in dict.fromkeys([cfg.model.name, cfg.fedpt.large_model]):
            memory[model] = measure_client(model, args.config, args.set)
    stem = args.results_dir / f"table-{cfg.name}"
    earlier = tables.earlier_results(stem) if args.keep_earlier else None
    results = tabulate(cfg, runs, memory, earlier)
    for m, seed_runs in runs.items():
        if m not in results:
            continue
        # the lr each row trained at, as its runs' configs say (all seeds kept: the one asked for)
        lr = tables.runs_lr(seed_runs.values()).get("lr") or own.get(m)
        kept = results[m].get("kept_seeds", [])
        # a row without --row-lr trains at the config's lr
        tables.refuse_lr_mix(LABELS[m], (earlier or {}).get(m, {}), lr, kept, cfg.train.lr)
        if own and lr is not None:
            results[m]["lr"] = lr
    command = tables.command_line(__file__, argv)
    text = markdown(cfg, results, command)
    text += tables.closing_notes({m: seed_runs.values() for m, seed_runs in runs.items()}, stem, args)
    tables.write_table(stem, text, cfg.name, command, results, args)


if __name__ == "__main__":
    main()
