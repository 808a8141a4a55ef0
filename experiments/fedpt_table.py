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

Client memory is measured in a fresh process per client model: load it, attach the run's LoRA, train
3 steps at batch 1 (the paper's "VRAM to train one sample") on real client examples, and read the
peak RSS (``VmHWM``, `fedtune.train.loop.peak_rss_mb`); the process's RSS before loading the model is
reported too. Bytes are the totals over the run from ``metrics.jsonl`` (up + down, all clients, all
rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import now, setup_torch

from experiments import plots, tables

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


def measure_client(model: str, config: Path, extra: list[str]) -> dict[str, float]:
    """Peak RSS of one client training ``model`` (subprocess running ``--client-memory``)."""
    command = [
        sys.executable,
        __file__,
        str(config),
        "--client-memory",
        model,
        *[part for item in extra for part in ("--set", item)],
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def client_memory_probe(model_name: str, config: Path, extra: list[str]) -> dict[str, float]:
    setup_torch(2)
    from fedtune.config import load_config
    from fedtune.data.tokenize import encode_records, make_batches
    from fedtune.models.loading import load_causal_lm
    from fedtune.models.lora import attach_lora
    from fedtune.rundata import prepare_data
    from fedtune.train.loop import peak_rss_mb, train_local
    from fedtune.train.optim import build_optimizer

    cfg = load_config(config, extra)
    records = next(iter(prepare_data(cfg).clients.values()))[:8]
    before = peak_rss_mb()
    model, tokenizer = load_causal_lm(model_name, dtype=cfg.model.dtype, seed=cfg.seed)
    lora = cfg.lora
    targets = None if lora.target_modules == "auto" else lora.target_modules
    model = attach_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=targets)
    examples = encode_records(records, tokenizer, cfg.data.template, cfg.data.max_length)
    pad = int(tokenizer.pad_token_id or 0)
    batches = make_batches(examples, 1, pad, seed=0, bucketing=False)
    optimizer = build_optimizer(model.parameters(), cfg.train.optimizer, lr=cfg.train.lr)
    train_local(model, batches, optimizer, None, steps=3)
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_m": sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        "rss_before_model_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }


def total_mb(rows: list[dict[str, Any]]) -> float:
    return sum(row.get("bytes_up", 0) + row.get("bytes_down", 0) for row in rows) / 2**20


def _fmt(metrics: dict[str, float], key: str, digits: int = 4) -> str:
    """The mean, ± its std where there is one (over sampling seeds, or over training seeds)."""
    return tables.plus_minus(metrics[key], metrics.get(f"{key}_std"), digits) if key in metrics else "-"


def test_sets(cfg: Any) -> list[tuple[str, str]]:
    """(label, metric prefix) per test set: the primary one, then ``eval.extra_datasets``."""
    primary = cfg.data.eval_dataset or cfg.data.dataset
    return [(primary, "")] + [(name, f"{name}/") for name in cfg.eval.extra_datasets]


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
    return {
        key.removesuffix("_by_seed"): values[seed]  # alpha_by_seed -> alpha, rougeL_by_seed -> rougeL
        for key, values in evaluation.items()
        if key.endswith("_by_seed") and seed in values
    }


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


def markdown(cfg: Any, results: dict[str, Any], command: str, stamp: str | None = None) -> str:
    """The table; ``stamp``: the time it was made (None: now)."""
    sets = test_sets(cfg)
    header = ["method", "client model", "client params", "client peak RSS (batch 1)", "total comm."]
    header += [f"Rouge-L {label}" for label, _ in sets] + ["Dist-3", "Dist-4"]
    header += [f"test ppl {label}" for label, _ in sets]
    seeds = max((len(res.get("training_seeds", [])) for res in results.values()), default=0)
    spread = (
        f"mean ± std over {seeds} training seeds (each seed: the mean over its sampling seeds)"
        if seeds > 1
        else "one training seed; ± is the std over the evaluation's sampling seeds"
    )
    lines = [
        f"# FedPT Table 1 structure: `{cfg.name}`",
        "",
        f"`{command}` — {stamp or now()}",
        "",
        f"Rouge-L and Dist-n: {spread}. Test ppl: deterministic perplexity of the method's output model "
        "on the test set's references.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for method in ("base_large", "fedavg_small", "fedavg_large", "fedavg_pt", "fedpt"):
        if method not in results:
            continue
        res = results[method]
        memory = res.get("memory") or {}
        cells = [
            LABELS[method],
            res["client_model"],
            f"{memory['params_m']:.1f}M" if memory else "-",
            f"{memory['peak_rss_mb']:.0f} MB" if memory else "-",
            f"{res['total_mb']:.1f} MB" if res["total_mb"] else "-",
        ]
        cells += [_fmt(res["eval"], prefix + "rougeL") for _, prefix in sets]
        cells += [_fmt(res["eval"], "dist3"), _fmt(res["eval"], "dist4")]
        cells += [_fmt(res["eval"], prefix + "perplexity", 2) for _, prefix in sets]
        lines.append("| " + " | ".join(cells) + " |")
    note = ordering_note(results, sets)
    lines += ["", note] if note else []
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
    header = ["method"] + [f"{label} s{seed}" for label, _ in sets for seed in seeds]
    rows = []
    for method in ("base_large", "fedavg_small", "fedavg_large", "fedavg_pt", "fedpt"):
        if method in results:
            evaluation = results[method]["eval"]
            cells = [LABELS[method]]
            for _, prefix in sets:
                by_seed = evaluation.get(f"{prefix}rougeL_by_seed", {})
                cells += [f"{by_seed[seed]:.4f}" if seed in by_seed else "-" for seed in seeds]
            rows.append(cells)
    return tables.markdown_table(header, rows).splitlines()


def ordering_note(results: dict[str, Any], sets: list[tuple[str, str]]) -> str:
    """Does the paper's ordering Base(large) < FedAvg(small) <= FedAvg+PT <= FedPT ~ FedAvg(large) hold?"""
    notes = []
    for label, prefix in sets:
        score = {m: r["eval"].get(prefix + "rougeL", math.nan) for m, r in results.items()}
        std = {m: r["eval"].get(prefix + "rougeL_std", 0.0) for m, r in results.items()}
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
            parts.append(f"{LABELS[a]} {relation} {LABELS[b]}: {verdict} ({gap:+.4f}{count})")
        if parts:
            notes.append(f"- {label}: " + "; ".join(parts))
    if not notes:  # fewer methods than any ordering compares (--methods fedpt)
        return ""
    return "Paper ordering (Rouge-L; `<=` allows one combined std of slack, `~` two):\n" + "\n".join(notes)


def stamp_of(recorded: tables.Recorded) -> str | None:
    """The time the .md beside the results file says it was made (after its command); None for none."""
    head = f"`{recorded.command}` — "
    line = next((line for line in recorded.markdown.splitlines() if line.startswith(head)), None)
    return None if line is None else line.removeprefix(head)


def render_table(recorded: tables.Recorded) -> str:
    return markdown(recorded.cfg, recorded.results, recorded.command, stamp_of(recorded))


def render_study(recorded: tables.Recorded) -> str:
    return study_text(recorded.cfg, recorded.results, recorded.command, stamp_of(recorded))


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
    parser.add_argument("--client-memory", help=argparse.SUPPRESS)
    args = tables.parse_args(parser, argv)
    if args.render:
        renderers = {"table-": render_table, "study-small-": render_study}
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    if args.client_memory:
        print(json.dumps(client_memory_probe(args.client_memory, args.config, args.set)))
        return
    cfg = tables.load_config(args)
    if args.small_models:
        if args.seeds != [cfg.seed]:
            parser.error(f"--small-models runs the config's seed ({cfg.seed}) only; drop --seeds")
        small_model_study(args, cfg, tables.command_line(__file__, argv))
        return
    root = args.runs_dir / cfg.name
    runs = {m: {seed: seed_run_dir(root, m, seed, cfg) for seed in args.seeds} for m in args.methods}
    overrides = {
        run_dir: run_overrides(m, cfg, [*args.set, *seed_overrides(seed, cfg)])
        for m, seed_runs in runs.items()
        for seed, run_dir in seed_runs.items()
    }
    tables.start(args, overrides, threads=None if args.jobs == 1 else 1)
    memory: dict[str, dict[str, float]] = {}
    if not args.no_memory:
        for model in dict.fromkeys([cfg.model.name, cfg.fedpt.large_model]):
            memory[model] = measure_client(model, args.config, args.set)
    stem = args.results_dir / f"table-{cfg.name}"
    results = tabulate(cfg, runs, memory, tables.earlier_results(stem) if args.keep_earlier else None)
    command = tables.command_line(__file__, argv)
    text = markdown(cfg, results, command)
    text += tables.closing_notes({m: seed_runs.values() for m, seed_runs in runs.items()}, stem, args)
    tables.write_table(stem, text, cfg.name, command, results, args)


STUDY_METHODS = ("fedavg_small", "fedpt")


def layer_count(model: str) -> int:
    from fedtune.models.loading import parse_tiny_name, resolve_source

    tiny = parse_tiny_name(model)
    if tiny is not None:
        return tiny.num_layers
    return int(
        json.loads((Path(resolve_source(model, "causal-lm")) / "config.json").read_text())[
            "num_hidden_layers"
        ]
    )


def held_out_perplexity(model: str) -> float | None:
    """The model's perplexity on the held-out public texts of `fedtune models derive`: a derived model's
    own (after its distillation), or, for a model others were derived from, the teacher's there."""
    from fedtune.models.loading import DERIVED_DIR, DERIVED_MARKER, derived_path
    from fedtune.models.zoo import default_cache_dir

    own = derived_path(model)
    if own is not None:
        return float(json.loads((own / DERIVED_MARKER).read_text())["student_ppl_after"])
    for info in sorted((default_cache_dir() / DERIVED_DIR).glob(f"*/{DERIVED_MARKER}")):
        saved = json.loads(info.read_text())
        if saved.get("source") == model:
            return float(saved["teacher_ppl"])
    return None


def study_root(args: Any, cfg: Any, model: str, layers: int) -> Path:
    """The config's own small model runs under the table's directory, another under ``<name>-l<layers>``."""
    return Path(args.runs_dir) / (cfg.name if model == cfg.model.name else f"{cfg.name}-l{layers}")


def small_model_study(args: Any, cfg: Any, command: str) -> None:
    """FedAvg (small) and FedPT with each of ``--small-models`` as the clients' model (the large model
    stays the config's); the large model itself as the small one is FedAvg (large), FedPT's target."""
    layers = {model: layer_count(model) for model in args.small_models}
    roots = {model: study_root(args, cfg, model, layers[model]) for model in args.small_models}
    runs = {
        roots[model] / method: run_overrides(method, cfg, [*args.set, f"model.name={model}"])
        for model in args.small_models
        for method in STUDY_METHODS
    }
    tables.start(args, runs, jobs=1, threads=None)
    sets = test_sets(cfg)
    results: dict[str, Any] = {}
    for model, root in roots.items():
        entry: dict[str, Any] = {"layers": layers[model], "held_out_ppl": held_out_perplexity(model)}
        for method in STUDY_METHODS:
            final = tables.last_evaluated(tables.finished_rows(root / method))
            if final is not None:
                entry[method] = final["eval"]
        results[model] = entry
    text = study_text(cfg, results, command)
    study_runs = (root / method for root in roots.values() for method in STUDY_METHODS)
    text += tables.rejected_note(study_runs, under=Path(args.runs_dir))
    stem = args.results_dir / f"study-small-{cfg.name}"
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot_small_model_study(cfg, results, sets, tables.sibling(stem, ".png"))


def study_text(cfg: Any, results: dict[str, Any], command: str, stamp: str | None = None) -> str:
    """The small-model study's table; ``stamp``: the time it was made (None: now)."""
    sets = test_sets(cfg)
    large = results.get(cfg.fedpt.large_model, {}).get("fedavg_small")
    header = ["client model", "layers", "held-out ppl", "FedAvg (small) test ppl"]
    for label, _ in sets:
        header += [f"FedAvg (small) {label}", f"FedPT {label}", f"FedPT - FedAvg (large) {label}"]
    header += ["FedPT test ppl", "alpha"]
    rows = []
    for model, entry in results.items():
        small, fedpt = entry.get("fedavg_small", {}), entry.get("fedpt", {})
        ppl = entry["held_out_ppl"]
        cells = [
            model,
            str(entry["layers"]),
            "-" if ppl is None else f"{ppl:.1f}",
            _plain(small, "perplexity"),
        ]
        for _, prefix in sets:
            key = prefix + "rougeL"
            gap = "-" if not large or key not in fedpt else f"{fedpt[key] - large[key]:+.4f}"
            cells += [_fmt(small, key), _fmt(fedpt, key), gap]
        cells += [_plain(fedpt, "perplexity"), str(fedpt.get("alpha", "-"))]
        rows.append(cells)
    return "\n".join(
        [
            f"# {cfg.name}: FedPT against the quality of the clients' small model",
            "",
            f"`{command}` — {stamp or now()}",
            "",
            f"Large model {cfg.fedpt.large_model}; each row's clients tune the small model named (FedAvg "
            "(small)) and FedPT proxy-tunes the large model with it. The large model as its own small model "
            "is FedAvg (large), FedPT's target. Held-out ppl: perplexity on the held-out public texts of "
            "`fedtune models derive` (the source's own for the large model). Rouge-L: mean ± std over the "
            "sampling seeds; test ppl: deterministic, on the in-domain test set.",
            "",
            tables.markdown_table(header, rows),
        ]
    )


def _plain(metrics: dict[str, Any], key: str) -> str:
    return f"{metrics[key]:.2f}" if key in metrics else "-"


def plot_small_model_study(
    cfg: Any, results: dict[str, Any], sets: list[tuple[str, str]], path: Path
) -> Path:
    """Per test set: Rouge-L of FedAvg (small) and FedPT against the small model's held-out perplexity
    (log axis), FedAvg (large) as a line."""
    figure, axes, first = plots.panel_grid(len(sets), 4.4, 3.3)
    points = [(entry["held_out_ppl"], entry) for entry in results.values() if entry["held_out_ppl"]]
    points.sort(key=lambda item: item[0])
    large = results.get(cfg.fedpt.large_model, {}).get("fedavg_small", {})
    for ax, (label, prefix) in zip(axes, sets, strict=True):
        key = prefix + "rougeL"
        for method, colour in (("fedavg_small", "#7f7f7f"), ("fedpt", "#1f77b4")):
            shown = [(x, e[method]) for x, e in points if key in e.get(method, {})]
            if shown:
                ax.errorbar(
                    [x for x, _ in shown],
                    [m[key] for _, m in shown],
                    yerr=[m.get(f"{key}_std", 0.0) for _, m in shown],
                    marker="o",
                    capsize=3,
                    color=colour,
                    label=LABELS[method],
                )
        if key in large:
            ax.axhline(large[key], color="#d62728", linestyle="--", label="FedAvg (large)")
        ax.set_title(label)
    title = f"{cfg.name}: FedPT against the small model's quality"
    xlabel = "small model's held-out perplexity"
    return plots.finish_grid(
        figure, axes, first, xlabel=xlabel, ylabel="Rouge-L", title=title, path=path, log_x=True
    )


if __name__ == "__main__":
    main()
