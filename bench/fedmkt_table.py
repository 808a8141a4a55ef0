"""FedMKT's Tables 2-4 at small scale: the LLM and every SLM under each setting and baseline.

    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --jobs 2                    # heterogeneous
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --settings homo one --seeds 0 1 2
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --datasets wic defchoice instruct
    python bench/fedmkt_table.py configs/paper/fedmkt-wic.yaml --table-only

Settings (``--settings``): ``hetero`` (the config's ``fedmkt.clients``: different SLMs and tokenizer
families), ``homo`` (every client holds the first SLM), ``one`` (one client, one SLM). Rows, each a
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
client's peak memory, and checks the paper's ordering (SLMs: Zero-shot < Standalone < FedMKT; LLM:
Zero-shot < FedMKT ≈ Centralized). Runs are subprocesses, ``--jobs`` at a time with one thread each;
rerunning resumes unfinished runs and skips finished ones.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_RESULTS_DIR, markdown_table, write_table
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


def settings(cfg: Any) -> dict[str, list[str]]:
    first = cfg.fedmkt.clients[0]
    return {
        "hetero": [],
        "homo": [f"fedmkt.clients=[{first}]"],
        "one": [f"fedmkt.clients=[{first}]", "data.partition.num_clients=1"],
    }


def runs(cfg: Any, dataset: str, setting: str) -> dict[str, list[str]]:
    """Run name -> overrides for one dataset and setting (the centralized runs are shared)."""
    base = DATASETS[dataset] + settings(cfg)[setting]
    out = {
        f"{dataset}-{setting}-fedmkt": base,
        f"{dataset}-{setting}-standalone": [*base, "fed.mode=standalone"],
    }
    if setting == "homo":
        out[f"{dataset}-homo-fedavg"] = [*base, *FEDIT, f"model.name={cfg.fedmkt.clients[0]}"]
    if setting == "one":
        out[f"{dataset}-one-llm2slm"] = [*base, "fedmkt.llm_learns=false"]
    out[f"{dataset}-centralized-llm"] = [*DATASETS[dataset], *FEDIT, "fed.mode=centralized"]
    for name in slms(cfg, setting):
        out[f"{dataset}-centralized-{name}"] = [
            *DATASETS[dataset],
            *FEDIT,
            "fed.mode=centralized",
            f"model.name={name}",
        ]
    return out


def slms(cfg: Any, setting: str) -> list[str]:
    return list(dict.fromkeys(cfg.fedmkt.clients)) if setting == "hetero" else [cfg.fedmkt.clients[0]]


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
    """Row -> column (llm / SLM name / traffic) -> values over seeds."""
    table: dict[str, dict[str, list[float]]] = {}

    def add(row: str, values: dict[str, float] | None) -> None:
        for key, value in (values or {}).items():
            table.setdefault(row, {}).setdefault(key, []).append(value)

    for seed in seeds:
        for row, rnd in (("zeroshot", 0), ("fedmkt", None)):
            add(row, scores(cfg, setting, root / f"{dataset}-{setting}-fedmkt-s{seed}", metric, rnd))
        add(
            "standalone", scores(cfg, setting, root / f"{dataset}-{setting}-standalone-s{seed}", metric, None)
        )
        if "standalone" in table:
            table["standalone"].pop("llm", None)  # the LLM does not train: its zero-shot score
        if setting == "one":
            add("llm2slm", scores(cfg, setting, root / f"{dataset}-one-llm2slm-s{seed}", metric, None))
        if setting == "homo":
            value = fedit_score(root / f"{dataset}-homo-fedavg-s{seed}", metric)
            add("fedavg", None if value is None else {cfg.fedmkt.clients[0]: value})
        centralized = {"llm": fedit_score(root / f"{dataset}-centralized-llm-s{seed}", metric)}
        for name in slms(cfg, setting):
            centralized[name] = fedit_score(root / f"{dataset}-centralized-{name}-s{seed}", metric)
        add("centralized", {k: v for k, v in centralized.items() if v is not None})
    return table


def cell(values: list[float] | None, scale: float = 100.0) -> str:
    if not values:
        return "-"
    text = f"{scale * np.mean(values):.1f}"
    return text + (f" ± {scale * np.std(values):.1f}" if len(values) > 1 else "")


def ordering(table: dict[str, Any], names: list[str]) -> list[str]:
    def mean(row: str, key: str) -> float | None:
        values = table.get(row, {}).get(key)
        return float(np.mean(values)) if values else None

    lines = []
    for name in names:
        zero, alone, mkt = mean("zeroshot", name), mean("standalone", name), mean("fedmkt", name)
        if zero is not None and alone is not None and mkt is not None:
            holds = zero < alone < mkt
            lines.append(
                f"- {name}: Zero-shot {100 * zero:.1f} < Standalone {100 * alone:.1f} < FedMKT "
                f"{100 * mkt:.1f}: **{'holds' if holds else 'does not hold'}**"
            )
    zero, mkt, central = mean("zeroshot", "llm"), mean("fedmkt", "llm"), mean("centralized", "llm")
    if zero is not None and mkt is not None and central is not None:
        lines.append(
            f"- LLM: Zero-shot {100 * zero:.1f} < FedMKT {100 * mkt:.1f} (Centralized {100 * central:.1f}): "
            f"**{'holds' if zero < mkt else 'does not hold'}**"
        )
    return lines


def markdown(
    cfg: Any, root: Path, datasets: list[str], chosen: list[str], seeds: list[int], command: str
) -> tuple[str, dict[str, Any]]:
    """The tables as markdown, and their values: ``<dataset>-<setting>`` -> row -> column -> per seed."""
    metric = cfg.eval.metrics[0]
    parts = [
        f"# FedMKT at small scale: {cfg.name} (LLM {cfg.model.name}; scores x 100, mean ± std over seeds)",
        "",
    ]
    results: dict[str, Any] = {}
    for dataset in datasets:
        data_metric = "rougeL" if dataset == "instruct" else metric
        for setting in chosen:
            names = slms(cfg, setting)
            table = collect(cfg, root, dataset, setting, seeds, data_metric)
            results[f"{dataset}-{setting}"] = table
            rows = []
            for row, label in LABELS.items():
                if row not in table:
                    continue
                values = table[row]
                traffic = (
                    f"{np.mean(values['mb_up']):.2f} / {np.mean(values['mb_down']):.2f}"
                    if "mb_up" in values
                    else "-"
                )
                memory = f"{np.mean(values['client_peak_mb']):.0f}" if "client_peak_mb" in values else "-"
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
                    ["", "LLM", *names, "MB up / down per round", "client peak MB", "seeds"], rows
                ),
                "",
                *ordering(table, names),
                "",
            ]
    parts.append(f"Command: `{command}`")
    return "\n".join(parts), results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--settings", nargs="+", default=["hetero"], choices=["hetero", "homo", "one"])
    parser.add_argument("--datasets", nargs="+", default=["wic"], choices=list(DATASETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/paper"))
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config)
    root = args.runs_dir / cfg.name
    if not args.table_only:
        planned: dict[str, list[str]] = {}
        for dataset in args.datasets:
            for setting in args.settings:
                for name, overrides in runs(cfg, dataset, setting).items():
                    for seed in args.seeds:
                        planned[f"{name}-s{seed}"] = [*overrides, f"seed={seed}"]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_one, args.config, o, root / name) for name, o in planned.items()]
            for future in futures:
                future.result()
    command = "python bench/fedmkt_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text, results = markdown(cfg, root, args.datasets, args.settings, args.seeds, command)
    write_table(args.results_dir / f"table-{cfg.name}", text, str(args.config), command, results)
    print(text)


if __name__ == "__main__":
    main()
