"""FedMKT's Tables 2-4 at small scale: the LLM and every SLM under each setting and baseline.

    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --jobs 2                    # heterogeneous
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --settings homo one --seeds 0 1 2
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --datasets wic defchoice instruct
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --table-only
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --datasets instruct \
        --set name=fedmkt-wic-llm1.5b --set model.name=qwen2.5-coder-1.5b-instruct  # another LLM

Settings (``--settings``): ``hetero`` (the config's ``fedmkt.clients``: different SLMs and tokenizer
families, as the paper's four), ``hetero2`` (the first two of them, each held by half the clients),
``homo`` (every client holds the first SLM), ``one`` (one client, one SLM). Rows, each a
normal run directory ``--runs-dir/<config name>/<dataset>-<setting>-<row>-s<seed>``:
- ``zeroshot``: round 0 of the ``fedmkt`` run (no tuning), the LLM and every SLM;
- ``standalone``: every SLM trains on its own data only (``fed.mode=standalone``), the LLM untouched;
- ``centralized``: FedIT in ``fed.mode=centralized`` on the union of the client data, for the LLM and
  for each SLM (one run each, shared by the settings);
- ``fedavg`` (homo only): FedIT of the SLM's LoRA;
- ``llm2slm`` (one only): FedMKT with the LLM frozen (``fedmkt.llm_learns=false``);
- ``fedmkt``: the method.
Every model is scored on the same test examples (``fedmkt.slm_eval: test``); an SLM's cell is the mean
over the clients holding it. The table gives mean ± std over seeds, MB up / down per round and the
peak RSS of the simulation's one process (it holds the LLM and every SLM; a client process of its
own is measured by ``bench/fedmkt_memory.py``), and checks the paper's ordering (SLMs: Zero-shot <
Standalone < FedMKT; LLM: Zero-shot < FedMKT ≈ Centralized) on the means and seed by seed;
``table-<config>.png`` shows the same cells with each seed as a dot. Runs are subprocesses,
``--jobs`` at a time with one thread each; rerunning resumes unfinished runs and skips finished ones.
``--set`` changes the config before the settings do (a run's own overrides win): with ``name=`` it
gives a table and runs directory of their own, e.g. for a larger LLM beside the same SLMs.
With ``--keep-earlier`` a seed asked for whose run is not in ``--runs-dir`` keeps its value from the
table's previous ``.json`` (cell by cell; runs here win), and the table names every seed so kept.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import earlier_results, markdown_table, panel_grid, sibling, table_parser, write_table
from bench.perfit_table import _finished, read_rows, run_one

DATASETS: dict[str, list[str]] = {
    "wic": ["data.dataset=wordnet-wic"],
    "defchoice": ["data.dataset=wordnet-defchoice"],
    "hypernym": ["data.dataset=wordnet-hypernym-yn"],
    "instruct": ["data.dataset=wordnet-instruct", "eval.metrics=[rougeL]"],
}
LABELS = {
    "zeroshot": "Zero-shot",
    "standalone": "Standalone",
    "centralized": "Centralized",
    "fedavg": "FedAvg",
    "llm2slm": "LLM2SLM",
    "fedmkt": "FedMKT",
}
FEDIT = ["algorithm=fedit", "fedmkt=null", "eval.personal=false"]
AFTER_ONLY = ["eval.before=false"]


SETTINGS = ["hetero", "hetero2", "homo", "one"]


def settings(cfg: Any) -> dict[str, list[str]]:
    first = cfg.fedmkt.clients[0]
    return {
        "hetero": [],
        "hetero2": [f"fedmkt.clients=[{','.join(slms(cfg, 'hetero2'))}]"],
        "homo": [f"fedmkt.clients=[{first}]"],
        "one": [f"fedmkt.clients=[{first}]", "data.partition.num_clients=1"],
    }


def runs(cfg: Any, dataset: str, setting: str) -> dict[str, list[str]]:
    """Run name -> overrides for one dataset and setting (the centralized runs are shared).

    Only the FedMKT run evaluates before training (its round 0 is the Zero-shot row): every other
    run starts from the same untuned models, so its round 0 would repeat that evaluation.
    """
    base = DATASETS[dataset] + settings(cfg)[setting]
    out = {
        f"{dataset}-{setting}-fedmkt": base,
        f"{dataset}-{setting}-standalone": [*base, "fed.mode=standalone", *AFTER_ONLY],
    }
    if setting == "homo":
        fedavg = [*base, *FEDIT, f"model.name={cfg.fedmkt.clients[0]}", *AFTER_ONLY]
        out[f"{dataset}-homo-fedavg"] = fedavg
    if setting == "one":
        out[f"{dataset}-one-llm2slm"] = [*base, "fedmkt.llm_learns=false", *AFTER_ONLY]
    centralized = [*DATASETS[dataset], *FEDIT, "fed.mode=centralized", *AFTER_ONLY]
    out[f"{dataset}-centralized-llm"] = centralized
    for name in slms(cfg, setting):
        out[f"{dataset}-centralized-{name}"] = [*centralized, f"model.name={name}"]
    return out


def planned(
    cfg: Any, datasets: list[str], chosen: list[str], seeds: list[int], extra: list[str]
) -> dict[str, list[str]]:
    """Run directory name -> overrides of every run of the table. ``extra`` (``--set``) comes first, as
    a change of the config: a run's own overrides win over it (a centralized SLM run keeps its SLM when
    ``--set model.name=...`` changes the LLM)."""
    out: dict[str, list[str]] = {}
    for dataset in datasets:
        for setting in chosen:
            for name, overrides in runs(cfg, dataset, setting).items():
                for seed in seeds:
                    out[f"{name}-s{seed}"] = [*extra, *overrides, f"seed={seed}"]
    return out


def slms(cfg: Any, setting: str) -> list[str]:
    """The distinct SLMs a setting's clients hold, in the order of ``fedmkt.clients``."""
    distinct = list(dict.fromkeys(cfg.fedmkt.clients))
    return {"hetero": distinct, "hetero2": distinct[:2]}.get(setting, distinct[:1])


def holders(cfg: Any, setting: str, run_dir: Path) -> dict[str, list[str]]:
    """SLM name -> the clients of a FedMKT run that hold it."""
    import yaml

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    names = saved["fedmkt"]["clients"]
    count = saved["data"]["partition"]["num_clients"]
    out: dict[str, list[str]] = {}
    for index in range(count):
        out.setdefault(names[index % len(names)], []).append(f"c{index:02d}")
    return out


def scores(cfg: Any, setting: str, run_dir: Path, metric: str, rnd: int | None) -> dict[str, float] | None:
    """The LLM's and each SLM's score in a finished run, at round ``rnd`` (None: the last evaluated)."""
    rows = read_rows(run_dir)
    if not rows or not _finished(run_dir, rows):
        return None
    evaluated = [r for r in rows if metric in r.get("eval", {}) and (rnd is None or r["round"] == rnd)]
    if not evaluated:
        return None
    row = evaluated[-1]
    out = {"llm": row["eval"][metric]}
    by_client = row.get("eval_by_client", {})
    for name, clients in holders(cfg, setting, run_dir).items():
        values = [by_client[c][metric] for c in clients if c in by_client]
        if values:
            out[name] = float(np.mean(values))
    trained = [r for r in rows if r.get("round", 0) > 0]
    out["mb_up"] = float(np.mean([r["bytes_up"] for r in trained])) / 1e6
    out["mb_down"] = float(np.mean([r["bytes_down"] for r in trained])) / 1e6
    out["client_peak_mb"] = max(float(r.get("client_peak_mem_mb", 0.0)) for r in trained)
    return out


def fedit_score(run_dir: Path, metric: str) -> float | None:
    rows = read_rows(run_dir)
    if not rows or not _finished(run_dir, rows):
        return None
    evaluated = [r for r in rows if metric in r.get("eval", {})]
    return float(evaluated[-1]["eval"][metric]) if evaluated else None


def collect(
    cfg: Any, root: Path, dataset: str, setting: str, seeds: list[int], metric: str
) -> dict[str, Any]:
    """Row -> column (llm / SLM name / traffic) -> seed -> value, from the finished runs here."""
    table: dict[str, dict[str, dict[str, float]]] = {}

    def add(row: str, seed: int, values: dict[str, float] | None) -> None:
        for key, value in (values or {}).items():
            table.setdefault(row, {}).setdefault(key, {})[str(seed)] = value

    for seed in seeds:
        for row, rnd in (("zeroshot", 0), ("fedmkt", None)):
            add(row, seed, scores(cfg, setting, root / f"{dataset}-{setting}-fedmkt-s{seed}", metric, rnd))
        alone = scores(cfg, setting, root / f"{dataset}-{setting}-standalone-s{seed}", metric, None)
        add("standalone", seed, {k: v for k, v in (alone or {}).items() if k != "llm"})  # LLM untrained
        if setting == "one":
            add("llm2slm", seed, scores(cfg, setting, root / f"{dataset}-one-llm2slm-s{seed}", metric, None))
        if setting == "homo":
            value = fedit_score(root / f"{dataset}-homo-fedavg-s{seed}", metric)
            add("fedavg", seed, None if value is None else {cfg.fedmkt.clients[0]: value})
        centralized = {"llm": fedit_score(root / f"{dataset}-centralized-llm-s{seed}", metric)}
        for name in slms(cfg, setting):
            centralized[name] = fedit_score(root / f"{dataset}-centralized-{name}-s{seed}", metric)
        add("centralized", seed, {k: v for k, v in centralized.items() if v is not None})
    return table


def keep_earlier(table: dict[str, Any], earlier: dict[str, Any], seeds: list[int]) -> dict[str, list[str]]:
    """Fill ``table`` with the seeds asked for that have no finished run here but a value in ``earlier``
    (the same table's previous results), cell by cell; return row -> the seeds so kept."""
    carried: dict[str, set[str]] = {}
    for row, columns in earlier.items():
        if row not in LABELS or not isinstance(columns, dict):
            continue
        for column, by_seed in columns.items():
            here = table.setdefault(row, {}).setdefault(column, {})
            for seed in map(str, seeds):
                if seed not in here and seed in by_seed:
                    here[seed] = float(by_seed[seed])
                    carried.setdefault(row, set()).add(seed)
            if not here:
                del table[row][column]
        if not table[row]:
            del table[row]
    return {row: sorted(found, key=int) for row, found in carried.items()}


def cell(by_seed: dict[str, float] | None, scale: float = 100.0) -> str:
    if not by_seed:
        return "-"
    values = list(by_seed.values())
    text = f"{scale * np.mean(values):.1f}"
    return text + (f" ± {scale * np.std(values):.1f}" if len(values) > 1 else "")


def ordering(table: dict[str, Any], names: list[str]) -> list[str]:
    """The paper's orderings on the means, and on each seed that has every row involved."""

    def mean(row: str, key: str) -> float | None:
        values = table.get(row, {}).get(key)
        # rounded: equal means of fractions must compare equal whatever order float summed them in
        return round(float(np.mean(list(values.values()))), 12) if values else None

    def per_seed(rows: list[str], key: str) -> list[list[float]]:
        columns = [table.get(row, {}).get(key, {}) for row in rows]
        common = sorted(set.intersection(*(set(c) for c in columns)), key=int)
        return [[c[seed] for c in columns] for seed in common]

    def seeds_note(values: list[list[float]], holds: Any) -> str:
        if len(values) < 2:
            return ""
        return f", in {sum(bool(holds(*v)) for v in values)} of {len(values)} seeds"

    lines = []
    for name in names:
        zero, alone, mkt = mean("zeroshot", name), mean("standalone", name), mean("fedmkt", name)
        if zero is not None and alone is not None and mkt is not None:
            rising = lambda a, b, c: a < b < c  # noqa: E731
            lines.append(
                f"- {name}: Zero-shot {100 * zero:.1f} < Standalone {100 * alone:.1f} < FedMKT "
                f"{100 * mkt:.1f}: **{'holds' if rising(zero, alone, mkt) else 'does not hold'}**"
                + seeds_note(per_seed(["zeroshot", "standalone", "fedmkt"], name), rising)
            )
    zero, mkt = mean("zeroshot", "llm"), mean("fedmkt", "llm")
    if zero is not None and mkt is not None:
        above = lambda a, b: a < b  # noqa: E731
        # the shared centralized runs may have seeds this setting's runs lack: compare on common seeds
        both = per_seed(["fedmkt", "centralized"], "llm")
        against = ""
        if both:
            central = float(np.mean([c for _, c in both]))
            gap = float(np.mean([m - c for m, c in both]))
            same = "seed" if len(both) == 1 else f"{len(both)} seeds"
            against = f" (Centralized {100 * central:.1f} on the same {same}, "
            against += f"FedMKT - Centralized {100 * gap:+.1f})"
        lines.append(
            f"- LLM: Zero-shot {100 * zero:.1f} < FedMKT {100 * mkt:.1f}{against}: "
            f"**{'holds' if above(zero, mkt) else 'does not hold'}**"
            + seeds_note(per_seed(["zeroshot", "fedmkt"], "llm"), above)
        )
    return lines


def markdown(
    cfg: Any,
    root: Path,
    datasets: list[str],
    chosen: list[str],
    seeds: list[int],
    command: str,
    earlier: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The tables as markdown, and their values: ``<dataset>-<setting>`` -> row -> column -> seed -> value
    (and ``carried``: ``<dataset>-<setting>`` -> row -> the seeds kept from ``earlier``)."""
    metric = cfg.eval.metrics[0]
    parts = [
        f"# FedMKT at small scale: {cfg.name} (LLM {cfg.model.name}; scores x 100, mean ± std over seeds)",
        "",
    ]
    results: dict[str, Any] = {}
    carried: dict[str, dict[str, list[str]]] = {}
    for dataset in datasets:
        data_metric = "rougeL" if dataset == "instruct" else metric
        for setting in chosen:
            key = f"{dataset}-{setting}"
            names = slms(cfg, setting)
            table = collect(cfg, root, dataset, setting, seeds, data_metric)
            if earlier is not None:
                kept = keep_earlier(table, earlier.get(key, {}), seeds)
                if kept:
                    carried[key] = kept
            if not set(table) - {"centralized"}:  # the shared centralized runs alone are no setting
                continue
            results[key] = table
            rows = []
            for row, label in LABELS.items():
                if row not in table:
                    continue
                values = table[row]
                mb_up = np.mean(list(values["mb_up"].values())) if "mb_up" in values else None
                mb_down = np.mean(list(values["mb_down"].values())) if "mb_down" in values else None
                traffic = "-" if mb_up is None else f"{mb_up:.2f} / {mb_down:.2f}"
                memory = (
                    f"{np.mean(list(values['client_peak_mb'].values())):.0f}"
                    if "client_peak_mb" in values
                    else "-"
                )
                seeds_done = max((len(v) for v in values.values()), default=0)
                rows.append(
                    [
                        label,
                        cell(values.get("llm")),
                        *(cell(values.get(n)) for n in names),
                        traffic,
                        memory,
                        seeds_done,
                    ]
                )
            parts += [
                f"## {dataset}, {setting} ({data_metric})",
                "",
                markdown_table(
                    ["", "LLM", *names, "MB up / down per round", "sim. peak RSS MB", "seeds"], rows
                ),
                "",
                *ordering(table, names),
                *(
                    [f"- Seeds kept from this table's previous results file (runs not in {root}): "]
                    if key in carried
                    else []
                ),
                *(f"  - {LABELS[row]}: {', '.join(kept)}" for row, kept in carried.get(key, {}).items()),
                "",
            ]
    parts.append(f"Command: `{command}`")
    if carried:
        results["carried"] = carried
    return "\n".join(parts), results


def plot(cfg: Any, results: dict[str, Any], path: Path) -> Path | None:
    """One panel per dataset and setting: per row the LLM's and each SLM's score, mean ± std as a marker
    with whiskers and each seed as a faint dot (differences are a few points: bars would hide them)."""
    panels = [key for key in results if key != "carried"]
    if not panels:
        return None
    figure, axes, first = panel_grid(len(panels), 4.6, 3.4, margin=0.8)
    models = ["llm", *dict.fromkeys(cfg.fedmkt.clients)]
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    markers = ["o", "s", "^", "D", "v"]
    for ax, key in zip(axes, panels, strict=True):
        table = results[key]
        rows = [row for row in LABELS if row in table]
        shown = [m for m in models if any(m in table[row] for row in rows)]
        for index, model in enumerate(shown):
            shift = (index - (len(shown) - 1) / 2) * 0.16
            xs, means, stds, dots = [], [], [], []
            for x, row in enumerate(rows):
                values = list(table[row].get(model, {}).values())
                if values:
                    xs.append(x + shift)
                    means.append(100 * np.mean(values))
                    stds.append(100 * np.std(values))
                    dots += [(x + shift + 0.04, 100 * v) for v in values]
            label = "LLM" if model == "llm" else model
            colour, marker = colours[index % len(colours)], markers[index % len(markers)]
            ax.errorbar(xs, means, yerr=stds, fmt=marker, color=colour, capsize=4, markersize=7, label=label)
            if dots:
                ax.scatter(*zip(*dots, strict=True), s=10, color=colour, alpha=0.45, zorder=3)
        ax.set_xticks(range(len(rows)), [LABELS[row] for row in rows], fontsize=7.5)
        ax.set_xlim(-0.5, len(rows) - 0.5)
        counts = sorted({len(v) for row in rows for v in table[row].values()})
        # the shared centralized rows may have more seeds than the setting's own
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        dataset, setting = key.rsplit("-", 1)
        ax.set_title(f"{dataset}, {setting} ({seeds} seed{'s' if seeds != '1' else ''})", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    for ax in first:
        ax.set_ylabel("score x 100 (acc or Rouge-L)")
    figure.suptitle(f"{cfg.name}: mean ± std over seeds; faint dots: each seed", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = table_parser(__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["hetero"], choices=SETTINGS)
    parser.add_argument("--datasets", nargs="+", default=["wic"], choices=list(DATASETS))
    parser.add_argument(
        "--keep-earlier",
        action="store_true",
        help="a seed asked for whose run is not in --runs-dir keeps the value of the table's previous "
        "results file (named under the table)",
    )
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config, args.set)
    root = args.runs_dir / cfg.name
    stem = args.results_dir / f"table-{cfg.name}"
    earlier = earlier_results(stem) if args.keep_earlier else None
    if not args.table_only:
        jobs = planned(cfg, args.datasets, args.settings, args.seeds, args.set)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_one, args.config, o, root / name) for name, o in jobs.items()]
            for future in futures:
                future.result()
    command = "python bench/fedmkt_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text, results = markdown(cfg, root, args.datasets, args.settings, args.seeds, command, earlier)
    write_table(stem, text, str(args.config), command, results)
    figure = plot(cfg, results, sibling(stem, ".png"))
    if figure is not None:
        print(f"plot: {figure}")


if __name__ == "__main__":
    main()
