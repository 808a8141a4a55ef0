"""FedMKT's Tables 2-4 at small scale: the LLM and every SLM under each setting and baseline.

    python experiments/fedmkt_table.py configs/paper/fedmkt-wic.yaml --jobs 2  # heterogeneous
    python experiments/fedmkt_table.py configs/paper/fedmkt-wic.yaml --settings homo one --seeds 0 1 2
    python experiments/fedmkt_table.py configs/paper/fedmkt-wic.yaml --datasets wic defchoice instruct
    python experiments/fedmkt_table.py configs/paper/fedmkt-wic.yaml --table-only
    python experiments/fedmkt_table.py configs/paper/fedmkt-wic.yaml --datasets instruct \
        --set name=fedmkt-wic-llm1.5b --set model.name=qwen2.5-coder-1.5b-instruct  # another LLM

Settings (``--settings``): ``hetero`` (the config's ``fedmkt.clients``: different SLMs and tokenizer
families, as the paper's four), ``hetero2`` (the first two of them, each held by half the clients),
``homo`` (every client holds the first SLM), ``one`` (one client, one SLM). Rows, each a
normal run directory ``--runs-dir/<config name>/<dataset>-<setting>-<row>-s<seed>``:
- ``zeroshot``: round 0 of the ``fedmkt`` run (no tuning), the LLM and every SLM;
- ``standalone``: every SLM trains on its own data only (``fed.mode=standalone``), the LLM untouched;
- ``centralized``: FedMKT in ``fed.mode=centralized``, as the paper: ``model:`` tuned on the union of the
  clients' private data and the public set, for the LLM and for each SLM (one run each, shared by the
  settings);
- ``llmpublic``: the LLM on the public set only (``fedmkt.lam=1``: its loss is the public set's CE, the
  SLMs' knowledge does not reach it, so every client holds the first SLM), shared by the settings: what
  FedMKT's LLM gains over it is what the SLMs' knowledge adds;
- ``slmpublic``: the control that attributes the SLMs' gain: FedMKT with ``fedmkt.lam=1`` and the LLM
  frozen (``fedmkt.llm_learns=false``), so each SLM trains on its private data and then on the public
  set's labels (CE) alone, every round, as in FedMKT, and nothing of the LLM reaches it: what FedMKT's
  SLM gains over it is what the LLM's knowledge adds;
- ``fedavg`` (homo only): FedIT of the SLM's LoRA;
- ``llm2slm`` (one only): FedMKT with the LLM frozen (``fedmkt.llm_learns=false``);
- ``fedmkt``: the method;
- ``commoner`` (no runs; yes/no and other tasks whose questions all offer the same choices): what
  answering the commoner answer of the seed's test questions to every one of them scores, the same in
  every column, and every row's paired interval against it per model: a score at that share is no
  sign the model learned the task.
Every model is scored on the same test examples (``fedmkt.slm_eval: test``); an SLM's cell is the mean
over the clients holding it. The table gives mean ± std over seeds, MB up / down per round and the
peak RSS of the simulation's one process (it holds the LLM and every SLM; a client process of its
own is measured by ``bench/fedmkt_memory.py``), and checks the paper's ordering (SLMs: Zero-shot <
Standalone < FedMKT; LLM: Zero-shot < FedMKT ≈ Centralized) on the means and seed by seed;
``table-<config>.png`` shows the same cells with each seed as a dot. With more than one round,
``rounds-<config>`` gives every round of the FedMKT runs (`experiments.fedmkt_rounds`). Runs are subprocesses,
``--jobs`` at a time with one thread each; rerunning resumes unfinished runs and skips finished ones.
``--rows`` starts only the named rows' runs (``fedmkt``, ``standalone``, ``centralized``, ``llmpublic``,
``slmpublic``, ``fedavg``, ``llm2slm``; the Zero-shot row is the FedMKT run's round 0): a seed whose other
rows were run elsewhere needs its FedMKT run alone. ``--models llm gemma-3-270m`` starts only those
models' Centralized runs (one run a model), in a table or a search. ``--set`` changes the config before
the settings do (a run's own overrides win): with ``name=`` it gives a table and runs directory of their
own, e.g. for a larger LLM beside the same SLMs.
With ``--keep-earlier`` a seed asked for whose run is not in ``--runs-dir`` keeps its value from the
table's previous ``.json`` (cell by cell; runs here win), and the table names every seed so kept.
``--shared-from table-<other>.json`` takes the Centralized and LLM-on-public seeds with no run here from
another table's results file, where that table was made from the same config and ``--set`` (its ``name=``
aside) at the same lrs: they are the same runs, one a model whatever the setting, so a setting's table of
its own name (one-to-one, homogeneous) need not run them again; the table names them.

Each row at its own lr: ``--lrs 1e-4 2e-4 5e-4`` searches every run of ``--rows`` (in each dataset and
setting asked for) at each lr on the validation split (every model is scored on it; the test split is not
read) and writes ``sweep-lr-<config name>``, whose last line is the ``--row-lr fedmkt=... standalone=...``
that runs the table with each row at its best lr (its runs ``<name>-lr<lr>-s<seed>``; the table says which
rows trained at which lr; a yes/no task's search says under its table what answering the commoner answer
of each seed's validation questions scores, the mark its cells must pass). A row's lr is that of every
model the row trains: the SLMs' ``train.lr`` and
the LLM's ``fedmkt.llm_train.lr`` (the config keeps the two equal; the paper fixes them per model, 3e-5 for
the LLM). A run's score is the mean of the scores of the models it trains: the LLM and every SLM for
FedMKT, the SLMs for Standalone, SLMs + public CE and LLM2SLM (their LLM does not learn), the one model
of a Centralized, LLM-on-public or FedAvg run. The Centralized runs (one per model) are searched one by
one; where their best lrs differ the ``--row-lr`` gives each model's (``centralized-llm=...
centralized-<SLM>=...``: a model's own lr wins over the row's ``centralized=``). ``--row-lr fedmkt=A
fedmkt-llm=B`` trains FedMKT's SLMs at A and its LLM at B (as the paper fixes an lr per model; runs
``<name>-llmlr<B>-lr<A>-s<seed>``), for an LLM whose best lr alone (its Centralized or LLM-on-public
row's) is not the SLMs'; the search does not search B.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import fedmkt_rounds, plots, tables
from experiments.fedmkt_models import (
    COLOURS,
    FEDMKT_LLM,
    Runs,
    holders,
    metric_of,
    model_scores,
    own_llm_lr,
    own_lr,
    row_of,
    run_path,
    run_row,
    slms,
)
from experiments.tables import layout, search

DATASETS: dict[str, list[str]] = {
    "wic": ["data.dataset=wordnet-wic"],
    "defchoice": ["data.dataset=wordnet-defchoice"],
    "hypernym": ["data.dataset=wordnet-hypernym-yn"],
    "instruct": ["data.dataset=wordnet-instruct", "eval.metrics=[rougeL]"],
}
LABELS = {
    "commoner": "Commoner answer",
    "zeroshot": "Zero-shot",
    "standalone": "Standalone",
    "centralized": "Centralized",
    "fedavg": "FedAvg",
    "llm2slm": "LLM2SLM",
    "llmpublic": "LLM on public set",
    "slmpublic": "SLMs + public CE",
    "fedmkt": "FedMKT",
}
FEDIT = ["algorithm=fedit", "fedmkt=null", "eval.personal=false"]
AFTER_ONLY = ["eval.before=false"]
CENTRALIZED = ["fed.mode=centralized", "eval.personal=false"]
# lam 1: the LLM learns the public set's CE only; the SLMs still train (one step, only so that the round
# runs: with lam 1 their knowledge does not reach the LLM) and are not evaluated.
LLM_PUBLIC = ["fedmkt.lam=1", "fedmkt.slm_learns=false", "eval.personal=false", "train.max_steps=1"]
# lam 1 and the LLM frozen: each SLM's public-set loss is the CE of the public labels alone (the LLM's
# knowledge still travels, weighted 0), the same steps as FedMKT's; the LLM is not a cell of this row.
SLM_PUBLIC = ["fedmkt.lam=1", "fedmkt.llm_learns=false"]


SETTINGS = ["hetero", "hetero2", "homo", "one"]
# the LLM's lr beside the SLMs' train.lr: a row's own lr sets both
LLM_LR = "fedmkt.llm_train.lr"


def at_lr(overrides: Sequence[str], lr: float) -> list[str]:
    """A run's overrides at its row's lr: every model it trains at ``lr``, the SLMs (``train.lr``) and the
    LLM (``fedmkt.llm_train.lr``; a FedIT run, with no fedmkt section, trains its one model by
    ``train.lr``)."""
    out = tables.train_lr(overrides, lr)
    return out if "fedmkt=null" in overrides else [*out, f"{LLM_LR}={lr}"]


def settings(cfg: Any) -> dict[str, list[str]]:
    first = cfg.fedmkt.clients[0]
    return {
        "hetero": [],
        "hetero2": [f"fedmkt.clients=[{','.join(slms(cfg, 'hetero2'))}]"],
        "homo": [f"fedmkt.clients=[{first}]"],
        "one": [f"fedmkt.clients=[{first}]", "data.partition.num_clients=1"],
    }


def runs(cfg: Any, dataset: str, setting: str) -> dict[str, list[str]]:
    """Run name -> overrides for one dataset and setting (the centralized and LLM-on-public runs are
    shared).

    Only the FedMKT run evaluates before training (its round 0 is the Zero-shot row) and after every
    round (its trajectory over rounds): every other run starts from the same untuned models, so its
    round 0 would repeat that evaluation, and it evaluates after its last round only.
    """
    base = DATASETS[dataset] + settings(cfg)[setting]
    after = [*AFTER_ONLY, f"eval.every={cfg.fed.rounds}"]
    out = {
        f"{dataset}-{setting}-fedmkt": base,
        f"{dataset}-{setting}-standalone": [*base, "fed.mode=standalone", *after],
        f"{dataset}-{setting}-slmpublic": [*base, *SLM_PUBLIC, *after],
    }
    if setting == "homo":
        fedavg = [*base, *FEDIT, f"model.name={cfg.fedmkt.clients[0]}", *after]
        out[f"{dataset}-homo-fedavg"] = fedavg
    if setting == "one":
        out[f"{dataset}-one-llm2slm"] = [*base, "fedmkt.llm_learns=false", *after]
    centralized = [*DATASETS[dataset], *CENTRALIZED, *after]
    out[f"{dataset}-centralized-llm"] = centralized
    # lam 1: nothing of the SLMs reaches the LLM, so every client holds the first SLM (the cheapest fleet,
    # and no derived model needed)
    public_only = [*DATASETS[dataset], *LLM_PUBLIC, f"fedmkt.clients=[{cfg.fedmkt.clients[0]}]"]
    out[f"{dataset}-llmpublic"] = [*public_only, *after]
    for name in slms(cfg, setting):
        out[f"{dataset}-centralized-{name}"] = [*centralized, f"model.name={name}"]
    return out


def planned(
    cfg: Any,
    datasets: list[str],
    chosen: list[str],
    seeds: list[int],
    extra: list[str],
    own: Mapping[str, float] | None = None,
) -> dict[str, list[str]]:
    """Run directory name -> overrides of every run of the table. ``extra`` (``--set``) comes first, as
    a change of the config: a run's own overrides win over it (a centralized SLM run keeps its SLM when
    ``--set model.name=...`` changes the LLM). A row that ``own`` (``--row-lr``) gives an lr trains at it
    (`at_lr`, last: it wins), in run directories of its own (`run_path`)."""
    out: dict[str, list[str]] = {}
    for dataset in datasets:
        for setting in chosen:
            for name, overrides in runs(cfg, dataset, setting).items():
                lr, llm = own_lr(name, own), own_llm_lr(name, own)
                trained = list(overrides) if lr is None else at_lr(overrides, lr)
                if llm is not None:  # FedMKT's LLM apart from its SLMs: last, it wins over the row's lr
                    trained.append(f"{LLM_LR}={llm}")
                for seed in seeds:
                    out[run_path(Path(), name, seed, own).name] = [*extra, *trained, f"seed={seed}"]
    return out


# What ``--rows`` picks: the runs it names start (the Zero-shot row is the FedMKT run's round 0).
ROWS = ("fedmkt", "standalone", "centralized", "llmpublic", "slmpublic", "fedavg", "llm2slm")


def pick_rows(jobs: dict[str, list[str]], rows: list[str]) -> dict[str, list[str]]:
    """The runs of ``jobs`` (run directory name -> overrides, from `planned`) that make ``rows``."""

    def row(name: str) -> str:
        return run_row(tables.run_name_parts(name)[0])  # a row at its own lr too

    return {name: overrides for name, overrides in jobs.items() if row(name) in rows}


def centralized_model(run: str) -> str | None:
    """The model a Centralized run directory ``run`` trains, ``llm`` or an SLM's name (the directory:
    ``<dataset>-centralized-<model>[-lr<lr>]-s<seed>``, a search's ``lr<lr>-`` before it); None for a run
    of any other row."""
    found = re.search(r"-centralized-(.+?)(?:-lr[0-9.]+(?:e[+-]?[0-9]+)?)?-s[0-9]+$", run)
    return None if found is None else found.group(1)


def pick_models(jobs: Mapping[Any, Sequence[str]], models: Sequence[str] | None) -> dict[Any, Sequence[str]]:
    """The runs of ``jobs`` (run directory, or its name, -> overrides) that ``--models`` lets start: every
    run but a Centralized one of a model not among ``models`` (None: every run)."""
    if not models:
        return dict(jobs)
    return {
        run: overrides
        for run, overrides in jobs.items()
        if centralized_model(Path(str(run)).name) in (None, *models)
    }


def check_models(parser: argparse.ArgumentParser, cfg: Any, args: Any) -> None:
    """``--models`` names Centralized runs: ``llm`` or an SLM of the settings asked for, with the
    centralized row among ``--rows``; anything else is a usage error that names what it may be."""
    if not args.models:
        return
    if "centralized" not in args.rows:
        parser.error("--models picks which Centralized runs start: give it with centralized among --rows")
    known = ["llm", *dict.fromkeys(name for setting in args.settings for name in slms(cfg, setting))]
    unknown = [name for name in args.models if name not in known]
    if unknown:
        parser.error(f"--models {' '.join(unknown)}: not a model of these settings' Centralized runs {known}")


def searched(cfg: Any, datasets: list[str], chosen: list[str], rows: list[str]) -> dict[str, list[str]]:
    """What ``--lrs`` searches: every run of ``rows`` in ``datasets`` x ``chosen`` (its name without the
    seed -> its overrides; the runs the settings share once), the FedMKT run's Zero-shot round aside."""
    return {
        name: overrides
        for dataset in datasets
        for setting in chosen
        for name, overrides in runs(cfg, dataset, setting).items()
        if row_of(name) in rows
    }


def trained_score(cfg: Any, name: str, run_dir: Path, metric: str) -> float | None:
    """The mean score of the models run ``name`` trains (see the module docstring), at its last
    evaluation; None until the run has finished with every one of them scored."""
    row = row_of(name)
    if row in ("llmpublic", "centralized", "fedavg"):  # one model, the server's
        return fedit_score(run_dir, metric)
    setting = name.split("-")[1]  # <dataset>-<setting>-<row>
    found = scores(cfg, setting, run_dir, metric, None) or {}
    models = ["llm", *slms(cfg, setting)] if row == "fedmkt" else slms(cfg, setting)
    if not all(model in found for model in models):
        return None
    return float(np.mean([found[model] for model in models]))


def search_of(cfg: Any, args: Any, parser: argparse.ArgumentParser | None = None) -> search.Search:
    """The lr search of ``args`` (its datasets, settings, rows and lrs), scored on the datasets' metric:
    one metric a search, so datasets of different metrics (Rouge-L for instruct) are searched apart."""
    metrics = {metric_of(cfg, dataset) for dataset in args.datasets}
    if len(metrics) > 1 and parser is not None:
        parser.error(
            f"--lrs ranks the runs by one metric, but --datasets score {sorted(metrics)}: search them apart"
        )
    metric = metrics.pop()
    lower = metric == "perplexity"
    score = search.Score(
        "score",
        f"{metric}{'' if lower else ' (x 100)'}, mean of the models each run trains",
        lower_is_better=lower,
        scale=1.0 if lower else 100.0,
    )
    names = list(searched(cfg, args.datasets, args.settings, args.rows))
    return search.Search(cfg, names, args.lrs, score, search_label, row_of, own_key, search_commoner)


def shares_text(shares: Mapping[str, float], digits: int = 1) -> str:
    """``53.1, 52.1, 59.4 in seeds 0, 1, 2`` (x 100) of seed -> share."""
    seeds = sorted(shares, key=int)
    values = ", ".join(f"{100 * shares[seed]:.{digits}f}" for seed in seeds)
    return f"{values} in seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"


def search_commoner(results: Mapping[str, Any]) -> list[str]:
    """A search's line per yes/no dataset: what answering the commoner answer of the seed's validation
    questions to every one of them scores (``commoner`` of the results, `commoner_shares`), the mark a
    cell must pass before it says its row learned the task."""
    return [
        f"{dataset}: answering the commoner answer to every validation question scores "
        f"{shares_text(shares, 2)} (one answer to every question scores that or its complement): a cell at "
        "or below it is no sign its row learned the task."
        for dataset, shares in results.get("commoner", {}).items()
    ]


def lr_label(key: str) -> str:
    """A ``--row-lr`` key's label: its row's, FedMKT's LLM's (``fedmkt-llm``), or a Centralized model's
    (``centralized-<model>``)."""
    if key == FEDMKT_LLM:
        return "FedMKT's LLM"
    return LABELS.get(key) or f"Centralized ({key.removeprefix('centralized-')})"


def lr_keys(cfg: Any) -> list[str]:
    """What ``--row-lr`` may name: a row, FedMKT's LLM (``fedmkt-llm``: its ``fedmkt.llm_train.lr``, apart
    from the SLMs' lr, ``fedmkt=``), or one model's Centralized runs (``centralized-llm``,
    ``centralized-<SLM>``), which then train at that lr whatever ``centralized=`` gives the others."""
    models = [f"centralized-{name}" for name in dict.fromkeys(cfg.fedmkt.clients)]
    return [*ROWS, FEDMKT_LLM, "centralized-llm", *models]


def own_key(name: str) -> str | None:
    """A searched run's own ``--row-lr`` key where its row's runs disagree on the best lr: a Centralized
    run's model (``centralized-<model>``); None for the other rows (one lr a row)."""
    return f"centralized-{name.split('-centralized-', 1)[1]}" if "-centralized-" in name else None


def search_label(name: str) -> str:
    """A searched run's label: its row, then its dataset and setting (or a shared run's model)."""
    dataset, rest = name.split("-", 1)
    if rest.startswith("centralized-"):
        return f"Centralized ({rest.removeprefix('centralized-')}), {dataset}"
    row = row_of(name)
    return f"{LABELS[row]}, {dataset}" + ("" if row == "llmpublic" else f" {rest.rsplit('-', 1)[0]}")


def lr_search(cfg: Any, args: Any, parser: argparse.ArgumentParser, root: Path, command: str) -> None:
    """``--lrs``: every searched run (`searched`) at each lr on validation, each one's best lr."""
    found = search_of(cfg, args, parser)
    metric = metric_of(cfg, args.datasets[0])
    keys = {search.search_key(lr, name): name for lr in args.lrs for name in found.rows}

    def summarise(paths: list[Path]) -> dict[str, Any]:
        name = keys[paths[0].name.rsplit("-s", 1)[0]]
        values = {tables.seed_of(path): trained_score(cfg, name, path, metric) for path in paths}
        return tables.over_seeds("score", {seed: v for seed, v in values.items() if v is not None})

    rows = searched(cfg, args.datasets, args.settings, args.rows)
    validation = [*args.set, "data.eval_split=validation"]  # the split every searched run scores
    shares = commoner_shares(args.config, validation, args.datasets, args.seeds)
    search.lr_search(
        args,
        found,
        root,
        rows,
        command,
        summarise,
        at_lr,
        starts=lambda runs: pick_models(runs, args.models),
        reference={"commoner": shares} if shares else None,
    )


def scores(cfg: Any, setting: str, run_dir: Path, metric: str, rnd: int | None) -> dict[str, float] | None:
    """The LLM's and each SLM's score in a finished run, at round ``rnd`` (None: the last evaluated)."""
    rows = tables.finished_rows(run_dir)
    evaluated = [r for r in rows if r["round"] == rnd and metric in r.get("eval", {})]
    row = tables.last_evaluated(rows, metric) if rnd is None else (evaluated or [None])[-1]
    if row is None:
        return None
    out = model_scores(row, holders(cfg, setting, run_dir), metric)
    trained = tables.trained_rows(rows)
    out["mb_up"] = tables.per_round_mb(trained, "bytes_up")
    out["mb_down"] = tables.per_round_mb(trained, "bytes_down")
    out["client_peak_mb"] = max(float(r.get("client_peak_mem_mb", 0.0)) for r in trained)
    return out


def fedit_score(run_dir: Path, metric: str) -> float | None:
    """The server model's last score: a FedIT run's, or the LLM's of a FedMKT run."""
    row = tables.last_evaluated(tables.finished_rows(run_dir), metric)
    return None if row is None else float(row["eval"][metric])


def collect(cfg: Any, runs: Runs) -> dict[str, Any]:
    """Row -> column (llm / SLM name / traffic) -> seed -> value, from the finished runs of ``runs`` (a
    row's runs at its own lr where ``runs.own``, ``--row-lr``, gives it one)."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    setting, metric, at = runs.setting, runs.metric, runs.path

    def add(row: str, seed: int, values: dict[str, float] | None) -> None:
        for key, value in (values or {}).items():
            table.setdefault(row, {}).setdefault(key, {})[str(seed)] = value

    for seed in runs.seeds:
        for row, rnd in (("zeroshot", 0), ("fedmkt", None)):
            add(row, seed, scores(cfg, setting, at(f"{setting}-fedmkt", seed), metric, rnd))
        alone = scores(cfg, setting, at(f"{setting}-standalone", seed), metric, None)
        add("standalone", seed, {k: v for k, v in (alone or {}).items() if k != "llm"})  # LLM untrained
        control = scores(cfg, setting, at(f"{setting}-slmpublic", seed), metric, None)
        add("slmpublic", seed, {k: v for k, v in (control or {}).items() if k != "llm"})  # LLM frozen
        if setting == "one":
            add("llm2slm", seed, scores(cfg, setting, at("one-llm2slm", seed), metric, None))
        if setting == "homo":
            value = fedit_score(at("homo-fedavg", seed), metric)
            add("fedavg", seed, None if value is None else {cfg.fedmkt.clients[0]: value})
        centralized = {"llm": fedit_score(at("centralized-llm", seed), metric)}
        for name in slms(cfg, setting):
            centralized[name] = fedit_score(at(f"centralized-{name}", seed), metric)
        add("centralized", seed, {k: v for k, v in centralized.items() if v is not None})
        public_only = fedit_score(at("llmpublic", seed), metric)
        add("llmpublic", seed, None if public_only is None else {"llm": public_only})
    return table


def ordering(table: dict[str, Any], names: list[str]) -> list[str]:
    """The paper's orderings on the means, and on each seed that has every row involved."""

    def column(row: str, key: str) -> dict[str, float]:
        return dict(table.get(row, {}).get(key, {}))

    def mean(values: dict[str, float]) -> float:
        return float(np.mean(list(values.values())))

    def seeds_note(claim: tables.Verdict) -> str:
        return f", in {claim.holding} of {claim.seeds} seeds" if claim.seeds > 1 else ""

    lines = []
    for name in names:
        rows = [column(row, name) for row in ("zeroshot", "standalone", "fedmkt")]
        columns, note = tables.on_common_seeds(rows)
        if all(columns):
            claim = tables.check(columns)
            zero, alone, mkt = claim.means
            noise = tables.claim_text(columns, ["Zero-shot", "Standalone", "FedMKT"], scale=100.0)
            lines.append(
                f"- {name}: Zero-shot {100 * zero:.1f} < Standalone {100 * alone:.1f} < FedMKT "
                f"{100 * mkt:.1f}{note}: **{claim.verdict}**" + seeds_note(claim) + f"; {noise}"
            )
        # FedMKT against the row without the LLM's knowledge, (homogeneous) against FedAvg, and
        # (one-to-one) against the LLM frozen
        for row, claim_of in (
            ("slmpublic", f"What the LLM's knowledge adds to {name}: SLMs + public CE"),
            ("fedavg", f"FedMKT over FedAvg for {name}: FedAvg"),
            ("llm2slm", f"FedMKT over LLM2SLM (the LLM frozen) for {name}: LLM2SLM"),
        ):
            paired, note = tables.on_common_seeds([column(row, name), column("fedmkt", name)])
            if all(paired):
                other, mkt = (mean(values) for values in paired)
                lines.append(
                    f"- {claim_of} {100 * other:.1f} vs FedMKT {100 * mkt:.1f}{note}; "
                    f"{tables.claim_text(paired, scale=100.0)}"
                )
    columns, note = tables.on_common_seeds([column("zeroshot", "llm"), column("fedmkt", "llm")])
    if all(columns):
        claim = tables.check(columns)
        zero, mkt = claim.means
        # the shared centralized runs may have seeds this setting's runs lack: compare on common seeds
        fedmkt, central = columns[1], column("centralized", "llm")
        both = tables.common_seeds([fedmkt, central])
        against = ""
        if both:
            gap = float(np.mean([fedmkt[seed] - central[seed] for seed in both]))
            same = "seed" if len(both) == 1 else f"{len(both)} seeds"
            against = f" (Centralized {100 * mean({s: central[s] for s in both}):.1f} on the same {same}, "
            against += f"FedMKT - Centralized {100 * gap:+.1f}: "
            against += tables.interval_texts([central, fedmkt], scale=100.0)[0] + ")"
        lines.append(
            f"- LLM: Zero-shot {100 * zero:.1f} < FedMKT {100 * mkt:.1f}{against}{note}: "
            f"**{claim.verdict}**" + seeds_note(claim) + f"; {tables.claim_text(columns, scale=100.0)}"
        )
        public = column("llmpublic", "llm")
        both = tables.common_seeds([fedmkt, public])
        if both:
            gain = float(np.mean([fedmkt[seed] - public[seed] for seed in both]))
            same = "seed" if len(both) == 1 else f"{len(both)} seeds"
            lines.append(
                f"- What the SLMs' knowledge adds to the LLM: FedMKT - LLM on the public set only "
                f"{100 * gain:+.1f} (on the same {same}); {tables.claim_text([public, fedmkt], scale=100.0)}"
            )
    return lines + against_commoner(table, names)


def against_commoner(table: dict[str, Any], names: list[str]) -> list[str]:
    """Per model, every row's paired interval against answering the commoner answer to every question
    (the ``commoner`` row): a row that does not hold above it has not shown it learned the task."""
    reference = table.get("commoner", {})
    lines = []
    for name in ["llm", *names]:
        base = reference.get(name)
        if not base:
            continue
        parts = []
        for row in LABELS:
            values = table.get(row, {}).get(name, {})
            if row != "commoner" and tables.common_seeds([base, values]):
                parts.append(f"{LABELS[row]} {tables.interval_texts([base, values], scale=100.0)[0]}")
        lines.append(
            f"- {'LLM' if name == 'llm' else name} against answering the commoner answer to every question "
            f"({shares_text(base)}): " + "; ".join(parts)
        )
    return lines


def tabulate(
    cfg: Any,
    root: Path,
    datasets: list[str],
    chosen: list[str],
    seeds: list[int],
    earlier: dict[str, Any] | None = None,
    own: Mapping[str, float] | None = None,
    commoner: Mapping[str, Mapping[str, float]] | None = None,
    shared: Shared | None = None,
) -> dict[str, Any]:
    """The tables' values: ``<dataset>-<setting>`` -> row -> column -> seed -> value (and ``carried``:
    ``<dataset>-<setting>`` -> row -> the seeds kept from ``earlier``; ``row_lr``: ``own``, the rows at
    their own lr). ``commoner`` (dataset -> seed -> share, `commoner_shares`) gives a dataset the
    reference row ``commoner``: what answering its commoner answer to every question scores, in every
    model's column. ``shared`` (`shared_cells`, ``--shared-from``) fills the seeds of the rows the
    settings share that have no run here (``shared``: ``<dataset>-<setting>`` -> row -> those seeds, and
    ``shared_from``: the file)."""
    results: dict[str, Any] = {}
    carried: dict[str, dict[str, list[str]]] = {}
    from_other: dict[str, dict[str, list[str]]] = {}
    for dataset in datasets:
        for setting in chosen:
            key = f"{dataset}-{setting}"
            table = collect(cfg, Runs(root, dataset, setting, seeds, metric_of(cfg, dataset), own or {}))
            if shared is not None:  # before --keep-earlier: runs here, then the shared runs, then earlier
                wanted = {"llm", *slms(cfg, setting)}
                cells = {
                    row: {model: by_seed for model, by_seed in columns.items() if model in wanted}
                    for row, columns in shared.cells.get(dataset, {}).items()
                }
                added = tables.fill_cells(table, cells, map(str, seeds))
                if added:
                    from_other[key] = added
            if earlier is not None:
                here = {model: set(cell) for model, cell in table.get("centralized", {}).items()}
                # the reference is no run: made afresh below, never carried
                then_rows = {row: cells for row, cells in earlier.get(key, {}).items() if row != "commoner"}
                kept = tables.fill_cells(table, then_rows, map(str, seeds), groups=LABELS)
                then_lrs = earlier.get("row_lr", {})
                for row, kept_seeds in kept.items():
                    if row == "centralized":  # one run a model, each at its own lr: checked model by model
                        for model, cell in table[row].items():
                            name = f"{dataset}-centralized-{model}"
                            then = {"lr": own_lr(name, then_lrs)}
                            added = sorted(set(cell) - here.get(model, set()), key=int)
                            label = f"{key}, {lr_label(f'centralized-{model}')}"
                            tables.refuse_lr_mix(label, then, own_lr(name, own), added, cfg.train.lr)
                        continue
                    then = {"lr": then_lrs.get(row)}
                    tables.refuse_lr_mix(
                        f"{key}, {LABELS[row]}", then, (own or {}).get(row), kept_seeds, cfg.train.lr
                    )
                    if row == "fedmkt":  # and its LLM's, at the row's lr where no fedmkt-llm= gives one
                        llm_then = {"lr": then_lrs.get(FEDMKT_LLM, then_lrs.get(row))}
                        llm_now = (own or {}).get(FEDMKT_LLM, (own or {}).get(row))
                        label = f"{key}, {lr_label(FEDMKT_LLM)}"
                        tables.refuse_lr_mix(label, llm_then, llm_now, kept_seeds, cfg.fedmkt.llm_train.lr)
                if kept:
                    carried[key] = kept
            if not set(table) - {"centralized", "llmpublic"}:  # the shared runs alone are no setting
                continue
            shares = (commoner or {}).get(dataset)
            if shares:  # every model answers the same questions: one reference for every column
                table["commoner"] = {model: dict(shares) for model in ["llm", *slms(cfg, setting)]}
            results[key] = table
    if carried:
        results["carried"] = carried
    if from_other and shared is not None:
        results["shared"], results["shared_from"] = from_other, shared.name
    if own:
        results["row_lr"] = dict(own)
    return results


NOT_TABLES = ("carried", "row_lr", "shared", "shared_from")  # `tabulate`'s keys of no dataset and setting
SHARED_ROWS = ("centralized", "llmpublic")  # one run each, the same in every setting (`runs`)


@dataclass(frozen=True)
class Shared:
    """``--shared-from``: another table's results file (``name``) and its cells of the rows the settings
    share, dataset -> row -> column -> seed -> value."""

    name: str
    cells: dict[str, dict[str, dict[str, dict[str, float]]]]


def shared_cells(
    path: Path, parser: argparse.ArgumentParser, args: Any, own: Mapping[str, float] | None
) -> Shared:
    """The Centralized and LLM-on-public cells of another FedMKT table's results file ``path``: the same
    runs as this table's (each is one run a model, whatever the setting) where that table was made from
    the same config with the same ``--set`` (its ``name=`` aside) and trained those rows at the lr this
    one asks for; anything else is refused, naming what differs."""
    try:
        record = json.loads(path.read_text())
        command, results = str(record["command"]), record["results"]
        theirs = tables.command_args(command, parser)
    except (OSError, ValueError, KeyError, TypeError, SystemExit) as error:
        raise SystemExit(f"--shared-from {path}: not a FedMKT table's results file ({error})") from error

    def sets(given: Sequence[str]) -> list[str]:
        return sorted(s for s in given if not s.startswith("name="))

    if Path(theirs.config).name != Path(args.config).name or sets(theirs.set) != sets(args.set):
        raise SystemExit(
            f"--shared-from {path}: made from {theirs.config} with --set {sets(theirs.set)}, this table "
            f"from {args.config} with --set {sets(args.set)} (name= aside): its runs are not this table's"
        )
    then = results.get("row_lr", {})
    cells: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for key, table in results.items():
        dataset = key.split("-", 1)[0]
        if key in NOT_TABLES or dataset not in args.datasets or not isinstance(table, dict):
            continue
        for row in SHARED_ROWS:
            for model, by_seed in table.get(row, {}).items():
                name = f"{dataset}-{row}" if row == "llmpublic" else f"{dataset}-centralized-{model}"
                if own_lr(name, then) != own_lr(name, own):
                    label = lr_label(f"centralized-{model}") if row == "centralized" else LABELS[row]
                    raise SystemExit(
                        f"--shared-from {path}: its {dataset} {label} trained at lr "
                        f"{own_lr(name, then)}, this table asks for {own_lr(name, own)} (None: the "
                        "config's): give this table's --row-lr that lr, or run the row here"
                    )
                cell = cells.setdefault(dataset, {}).setdefault(row, {}).setdefault(model, {})
                cell.update({seed: v for seed, v in by_seed.items() if seed not in cell})
    return Shared(path.name, cells)


def commoner_shares(
    config: Path, sets: Sequence[str], datasets: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Dataset -> seed -> the share of that seed's test questions that answering the commoner answer to
    every one of them gets right (`fedtune.eval.metrics.commonest_answer`), for the datasets whose
    questions all offer the same choices (yes/no pairs); the others have no such answer and no entry."""
    from fedtune.config import load_config
    from fedtune.eval.metrics import commonest_answer
    from fedtune.eval.scoring import CHOICE_METRICS
    from fedtune.rundata import prepare_data

    shares: dict[str, dict[str, float]] = {}
    for dataset in datasets:
        for seed in seeds:
            cfg = load_config(config, [*sets, *DATASETS[dataset], f"seed={seed}"])
            if metric_of(cfg, dataset) not in CHOICE_METRICS:
                break
            records = prepare_data(cfg).eval_records
            found = commonest_answer([r.choices for r in records], [r.label for r in records])
            if found is None:
                break
            shares.setdefault(dataset, {})[str(seed)] = found[1]
    return shares


Cells = dict[str, dict[str, float]]  # a row's values: column -> seed -> value


def columns(names: list[str]) -> list[layout.Column[tuple[str, Cells]]]:
    """A setting's columns: the row, the LLM's and each SLM's score x 100, traffic, memory, seeds."""

    def mean(values: Cells, key: str, digits: int) -> str:
        return f"{np.mean(list(values[key].values())):.{digits}f}"

    def traffic(values: Cells) -> str:
        return "-" if "mb_up" not in values else f"{mean(values, 'mb_up', 2)} / {mean(values, 'mb_down', 2)}"

    def score(header: str, model: str) -> layout.Column[tuple[str, Cells]]:
        return layout.Column(header, lambda row: tables.cell(row[1].get(model), 1, 100.0))

    return [
        layout.Column("", lambda row: row[0]),
        score("LLM", "llm"),
        *(score(name, name) for name in names),
        layout.Column("MB up / down per round", lambda row: traffic(row[1])),
        layout.Column(
            "sim. peak RSS MB",
            lambda row: mean(row[1], "client_peak_mb", 0) if "client_peak_mb" in row[1] else "-",
        ),
        layout.Column("seeds", lambda row: max((len(v) for v in row[1].values()), default=0)),
    ]


def markdown(
    cfg: Any, results: dict[str, Any], datasets: list[str], chosen: list[str], root: Path, command: str
) -> str:
    """The tables of `tabulate`'s ``results`` as markdown, one per dataset and setting."""
    parts = [
        f"# FedMKT at small scale: {cfg.name} (LLM {cfg.model.name}; scores x 100, mean ± std over seeds)",
        "",
    ]
    own = results.get("row_lr", {})
    if own:
        at = ", ".join(f"{lr_label(row)} {lr:g}" for row, lr in own.items())
        parts += [
            f"Rows at their own lr (the SLMs' train.lr and the LLM's {LLM_LR}): {at}; the others at "
            f"the config's (train.lr {cfg.train.lr:g}, {LLM_LR} {cfg.fedmkt.llm_train.lr:g}).",
            "",
        ]
    carried = results.get("carried", {})
    for dataset in datasets:
        data_metric = metric_of(cfg, dataset)
        for setting in chosen:
            key = f"{dataset}-{setting}"
            if key not in results:
                continue
            names = slms(cfg, setting)
            table = results[key]
            rows = [(LABELS[row], table[row]) for row in LABELS if row in table]
            parts += [
                f"## {dataset}, {setting} ({data_metric})",
                "",
                layout.table(columns(names), rows),
                "",
                *ordering(table, names),
                *(
                    [f"- Seeds kept from this table's previous results file (runs not in {root}): "]
                    if key in carried
                    else []
                ),
                *(f"  - {LABELS[row]}: {', '.join(kept)}" for row, kept in carried.get(key, {}).items()),
                *(
                    [
                        f"- Seeds of the runs the settings share taken from {results.get('shared_from')} "
                        f"(the same runs: same config, --set and lr; not in {root}):"
                    ]
                    if key in results.get("shared", {})
                    else []
                ),
                *(
                    f"  - {LABELS[row]}: {', '.join(got)}"
                    for row, got in results.get("shared", {}).get(key, {}).items()
                ),
                "",
            ]
    parts.append(f"Command: `{command}`")
    return "\n".join(parts)


def plot(cfg: Any, results: dict[str, Any], path: Path) -> Path | None:
    """One panel per dataset and setting: per row the LLM's and each SLM's score, mean ± std as a marker
    with whiskers and each seed as a faint dot (differences are a few points: bars would hide them)."""
    models = ["llm", *dict.fromkeys(cfg.fedmkt.clients)]
    markers = ["o", "s", "^", "D", "v"]
    panels = []
    for key in (key for key in results if key not in NOT_TABLES):
        table = results[key]
        rows = [row for row in LABELS if row in table]
        shown = [m for m in models if any(m in table[row] for row in rows)]
        series = [
            plots.Series(
                "LLM" if model == "llm" else model,
                COLOURS[index % len(COLOURS)],
                markers[index % len(markers)],
                (index - (len(shown) - 1) / 2) * 0.16,
                [[100 * v for v in table[row].get(model, {}).values()] for row in rows],
            )
            for index, model in enumerate(shown)
        ]
        counts = sorted({len(v) for row in rows for v in table[row].values()})
        # the shared centralized rows may have more seeds than the setting's own
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        dataset, setting = key.rsplit("-", 1)
        title = f"{dataset}, {setting} ({tables.seeds_text(seeds)})"
        panels.append(plots.Panel(title, [LABELS[row] for row in rows], series))
    if not panels:
        return None
    return plots.seed_panels(
        panels,
        width=4.6,
        height=3.4,
        margin=0.8,
        ylabel="score x 100 (acc or Rouge-L)",
        title=f"{cfg.name}: mean ± std over seeds; faint dots: each seed",
        path=path,
        legend_in_panels=True,
    )


def render_table(recorded: tables.Recorded) -> str:
    cfg, args = recorded.cfg, recorded.args
    root = args.runs_dir / cfg.name
    return markdown(cfg, recorded.results, args.datasets, args.settings, root, recorded.command)


def render_search(recorded: tables.Recorded) -> str:
    return search.render_search(recorded, search_of(recorded.cfg, recorded.args))


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__.splitlines()[0], keep_earlier=True)
    parser.add_argument("--settings", nargs="+", default=["hetero"], choices=SETTINGS)
    parser.add_argument("--datasets", nargs="+", default=["wic"], choices=list(DATASETS))
    parser.add_argument(
        "--rows",
        nargs="+",
        default=list(ROWS),
        choices=ROWS,
        help="start only these rows' runs (default: all); the table reads every row, --keep-earlier "
        "keeping the values of runs made elsewhere; with --lrs, the rows searched",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help="start only these models' Centralized runs (llm, or an SLM's name; default every one): a "
        "Centralized run is one model's, so a search or a table can run some models and keep the others",
    )
    parser.add_argument(
        "--shared-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="take the seeds of the Centralized and LLM-on-public rows (one run a model, the same in every "
        "setting) that have no run here from another FedMKT table's results file made from the same "
        "config and --set (name= aside) at the same lrs, e.g. the heterogeneous table's for a one-to-one "
        "table of its own name; the table names them",
    )
    tables.row_lr_option(parser, "fedmkt=0.0001")
    search.lrs_option(parser)
    args = tables.parse_args(parser, argv)
    if args.render:
        renderers = {
            "table-": render_table,
            "rounds-": fedmkt_rounds.render_rounds,
            search.PREFIX: render_search,
        }
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    cfg = tables.load_config(args)
    own = search.own_lrs(parser, args, lr_keys(cfg))
    root = args.runs_dir / cfg.name
    command = tables.command_line(__file__, argv)
    check_models(parser, cfg, args)
    if args.lrs:
        lr_search(cfg, args, parser, root, command)
        return
    stem = args.results_dir / f"table-{cfg.name}"
    earlier = tables.earlier_results(stem) if args.keep_earlier else None
    jobs = planned(cfg, args.datasets, args.settings, args.seeds, args.set, own)
    picked = pick_models(pick_rows(jobs, args.rows), args.models)
    tables.start(args, {root / name: overrides for name, overrides in picked.items()})
    shares = commoner_shares(args.config, args.set, args.datasets, args.seeds)
    shared = None if args.shared_from is None else shared_cells(args.shared_from, parser, args, own)
    results = tabulate(cfg, root, args.datasets, args.settings, args.seeds, earlier, own, shares, shared)
    text = markdown(cfg, results, args.datasets, args.settings, root, command)
    text += tables.closing_notes({"every run": [root / name for name in jobs]}, stem, args)
    tables.write_table(stem, text, str(args.config), command, results, args)
    figure = plot(cfg, results, tables.sibling(stem, ".png"))
    if figure is not None:
        print(f"plot: {figure}")
    if cfg.fed.rounds > 1:
        fedmkt_rounds.write_rounds(cfg, args, root, command, own)


if __name__ == "__main__":
    main()
