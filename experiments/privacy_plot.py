"""Utility against privacy: the test perplexity each DP run ends at, against its ε, beside the run without
DP (docs/privacy.md gives the commands that make the runs).

    python experiments/privacy_plot.py runs/privacy/eps-inf runs/privacy/eps-8 runs/privacy/eps-4 \
        runs/privacy/eps-1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import plots, tables

ROOT = Path(__file__).resolve().parents[1]


def point(run_dir: Path) -> dict[str, float | None]:
    """The run's final ε (None without DP), its perplexity before training and at its last evaluation."""
    rows = tables.finished_rows(run_dir)
    if not rows:
        raise SystemExit(f"{run_dir}: no finished rounds in metrics.jsonl")
    evaluated = [row for row in rows if "perplexity" in row.get("eval", {})]
    last = rows[-1]
    return {
        "epsilon": last.get("dp_epsilon"),
        "noise_multiplier": last.get("dp_noise_multiplier"),
        "before": evaluated[0]["eval"]["perplexity"],
        "after": evaluated[-1]["eval"]["perplexity"],
        "rounds": last["round"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "privacy-utility")
    args = parser.parse_args(argv)
    points = {str(run): point(run) for run in args.runs}
    private = sorted((p for p in points.values() if p["epsilon"] is not None), key=lambda p: p["epsilon"])
    plain = [p for p in points.values() if p["epsilon"] is None]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.4))
    axis.plot([p["epsilon"] for p in private], [p["after"] for p in private], "o-", label="with DP")
    for p in plain:
        axis.axhline(p["after"], color="tab:green", linestyle="--", label="no DP (ε = ∞)")
    before = next(iter(points.values()))["before"]
    axis.axhline(before, color="grey", linestyle=":", label="before training")
    axis.set_xscale("log")
    ticks = [p["epsilon"] for p in private]
    axis.set_xticks(ticks, [f"{t:.3g}" for t in ticks])
    axis.minorticks_off()
    axis.set_xlabel("ε spent (δ = 1e-5)")
    axis.set_ylabel("test perplexity (lower is better)")
    axis.set_title("FedIT, SmolLM2-135M, 100 clients, q = 0.1")
    axis.legend(fontsize=8)
    figure.tight_layout()
    plots.save_figure(figure, args.out.with_suffix(".png"))
    args.out.with_suffix(".json").write_text(json.dumps(points, indent=1) + "\n")
    for run, p in points.items():
        print(f"{run}: epsilon {p['epsilon']}, perplexity {p['before']:.2f} -> {p['after']:.2f}")


if __name__ == "__main__":
    main()
