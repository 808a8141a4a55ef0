"""Lying clients against every method: each attack x each method x each aggregator, on the tiny configs.

    python experiments/attacks.py                      # all registered methods, writes the table below
    python experiments/attacks.py --methods fedit perfit --out /tmp/attacks.md

One client (the first) alters its ``fit`` reply in round 1 of 2 (through the runner's after-task hook);
every other client is honest. A cell says what the server did with the lie: ``rejected`` (the reply was
dropped, with the reason in the round's ``rejected``), or ``absorbed`` with the change of the final
metric against the same run where no client lies (``+12%``: 12% higher) and how much larger the
server's aggregate after round 1 is (its largest |value|; ``x1``: as without the lie). A tiny random
model's perplexity barely moves even when its weights are wrecked: read the aggregate's growth.
``run stopped``: the lie ended the run; ``refused``: the method does not take that aggregator;
``-``: the method's fit replies carry no such field. The aggregators: the default (the method's
weighted mean, behind the adaptive screen ``fed.screen``), the mean with the screen off, and the
coordinate-wise median and trimmed mean (``fed.trim=0.25``: one of the four clients dropped at each
end), both with the screen off.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import setup_torch

from experiments import tables

ROOT = Path(__file__).resolve().parents[1]
Reply = dict[str, Any]


def _scale(reply: Reply) -> Reply:
    return {k: (v * 1e6).astype(v.dtype) if _is_float(v) else v for k, v in reply.items()}


def _huge_entry(reply: Reply) -> Reply:
    changed = dict(reply)
    for key, value in reply.items():
        if _is_float(value) and value.size:
            changed[key] = value.copy()
            changed[key].flat[0] = 3e38
            break
    return changed


def _field(name: str, value: float) -> Callable[[Reply], Reply]:
    return lambda reply: {**reply, name: value} if name in reply else reply


def _is_float(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"


ATTACKS: dict[str, Callable[[Reply], Reply]] = {
    "update x 1e6": _scale,
    "one entry 3e38": _huge_entry,
    "train_loss -1e9": _field("train_loss", -1e9),
    "num_examples 1e9": _field("num_examples", 10**9),
}
AGGREGATORS: dict[str, list[str]] = {
    "mean + screen (default)": [],
    "mean, no screen": ["fed.screen=null"],
    "median": ["fed.screen=null", "fed.aggregator=median"],
    "trimmed mean": ["fed.screen=null", "fed.aggregator=trimmed_mean", "fed.trim=0.25"],
}


def final_metric(history: list[dict[str, Any]]) -> tuple[str, float]:
    """The last row's perplexity (a tiny random model's Rouge-L is 0), else its accuracy, else its first
    evaluation metric: (name, value)."""
    scores = history[-1]["eval"]
    plain = [k for k in scores if not k.endswith(("_weighted", "_std"))]
    name = next(
        (k for k in plain if "perplexity" in k), next((k for k in plain if "accuracy" in k), plain[0])
    )
    return name, float(scores[name])


NOTES = """## Reading the table

- With the defaults every lie is rejected, except FedMKT's: its fit reply carries knowledge on public
  data, not an update of weights the server sent. Its top-k logits travel compressed (bytes, not floats),
  so the two scaling attacks change only its per-sample losses, and a larger loss only loses DualMinCE:
  the aggregate does not move (x1). A negative loss, which would win DualMinCE, is rejected. With
  `slm_fedavg` its clients also upload their LoRA, measured from the last average the server sent:
  the screen rejects a scaled one, and without the screen the average takes it in like any mean.
- Krum and multi-Krum are not offered: they tolerate f liars only with n > 2f + 2 replies a round,
  more than the 3-10 clients per round these methods run with; the median covers that case.
- Without the screen, a mean takes the lie in: the aggregate grows 3e5-fold (x 1e6) or to ~1e38 (one
  entry). FedPFT's run then stops: in round 2 every client's training diverges (NaN loss, all replies
  rejected).
- The median and the trimmed mean keep the aggregate where the honest run has it (x1) for every method
  but PerFIT, whose median is per entry over the clients holding it: an entry held by one or two clients
  is not protected (x 6.7e5 for x 1e6). PerFIT refuses a trimmed mean.
- The tiny models' final metric hardly moves even when the aggregate is wrecked (a random tiny model is
  near-uniform already); FedPFT's tiny classifier scores 0 on its 16 test records either way.
"""


def largest_float(tree: Any) -> float:
    """The largest |value| of any float array in a state tree (the server's aggregate)."""
    if isinstance(tree, dict):
        return max((largest_float(v) for v in tree.values()), default=0.0)
    if isinstance(tree, list):
        return max((largest_float(v) for v in tree), default=0.0)
    if _is_float(tree) and tree.size:
        return float(np.nanmax(np.abs(tree)))
    return 0.0


VARIANTS: dict[str, tuple[str, list[str]]] = {
    "fedmkt+slm_fedavg": ("fedmkt", ["fedmkt.clients=[tiny-qwen2]", "fedmkt.slm_fedavg=true"]),
}
"""Rows for settings under which a method's fit reply changes kind: FedMKT's clients upload their LoRA
(averaged by the server) beside their knowledge."""


def run(method: str, overrides: list[str], attack: Callable[[Reply], Reply] | None) -> dict[str, Any]:
    """One tiny run; what happened to the liar's round-1 fit reply, the final metric and the size of
    the server's aggregate after round 1 (its largest |value|)."""
    from rich.console import Console

    from fedtune.config import load_config
    from fedtune.fl.checkpoint import load_checkpoint
    from fedtune.runner import Runner

    method, settings = VARIANTS.get(method, (method, []))
    cfg = load_config(
        ROOT / "configs" / "test" / f"{method}-tiny.yaml", ["fed.rounds=2", *settings, *overrides]
    )
    touched: list[bool] = []

    def lie(client: str, task: str, rnd: int, reply: Reply) -> Reply:
        if attack is None or client != "c00" or task != "fit" or rnd != 1:
            return reply
        changed = attack(reply)
        touched.append(changed is not reply)
        return changed

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        try:
            history = Runner(cfg, run_dir, console=Console(quiet=True), after_task=lie).run()
        except Exception as exc:  # a lie that stops the run is a result too
            return {"touched": any(touched), "error": f"{type(exc).__name__}: {exc}"[:300]}
        state = load_checkpoint(run_dir / "checkpoints" / "round_0001")["algorithm"]
    name, value = final_metric(history)
    return {
        "touched": any(touched),
        "rejected": history[1]["rejected"].get("c00"),
        "metric": name,
        "value": value,
        "aggregate": largest_float(state),
    }


def cell(result: dict[str, Any], honest: dict[str, Any]) -> str:
    if honest.get("error"):
        return "refused"
    if not result["touched"]:
        return "-"
    if result.get("error"):
        return "run stopped" + (" (a later round failed)" if "RoundFailed" in result["error"] else "")
    if result.get("rejected"):
        return "rejected"
    base, value = honest["value"], result["value"]
    growth = result["aggregate"] / honest["aggregate"] if honest.get("aggregate") else float("nan")
    if not math.isfinite(value):
        return f"absorbed: {result['metric']} {value}, aggregate x{growth:.3g}"
    change = f"{(value - base) / abs(base):+.0%}" if base else f"{base:.3g} -> {value:.3g}"
    return f"absorbed ({change}, aggregate x{growth:.3g})"


def main(argv: list[str] | None = None) -> None:
    from fedtune.algorithms.registry import algorithm_names

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", nargs="+", default=[*algorithm_names(), *VARIANTS])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "robustness.md")
    parser.add_argument("--json", type=Path, default=ROOT / "experiments" / "results" / "attacks.json")
    args = parser.parse_args(argv)
    setup_torch(1)
    results: dict[str, Any] = {}
    lines = [
        "# Lying clients: what each method does with them",
        "",
        __doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
        "",
        f"`{tables.command_line(__file__, argv)}`",
        "",
    ]
    for aggregator, settings in AGGREGATORS.items():
        rows = []
        for method in args.methods:
            honest = run(method, settings, None)
            if honest.get("error"):
                row = [method, honest["error"].split(":")[0], *(["refused"] * len(ATTACKS))]
                results[f"{aggregator}/{method}"] = honest
                rows.append(row)
                continue
            row = [method, f"{honest['metric']} {honest['value']:.4g}"]
            for attack_name, attack in ATTACKS.items():
                result = run(method, settings, attack)
                results[f"{aggregator}/{method}/{attack_name}"] = {**result, "honest": honest.get("value")}
                row.append(cell(result, honest))
            rows.append(row)
        lines += [f"## {aggregator}", "", tables.markdown_table(["method", "honest", *ATTACKS], rows), ""]
    lines.append(NOTES)
    args.out.write_text("\n".join(lines))
    args.json.write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
