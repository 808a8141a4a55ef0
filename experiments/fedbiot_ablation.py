"""FedBiOT's Appendix C on one task, beside its table (``--ablation``): lambda (Table 5) and eps (Table 7),
FedBiOT adapter 2 at dropout 0.2, written to ``ablation-<config name>``; the default variant is the table's
own FedBiOT (adapter 2, d = 0.2) run."""

from __future__ import annotations

from typing import Any

from experiments import tables
from experiments.fedbiot_rows import primary_metric
from experiments.tables import layout

# Appendix C on one task: lambda (Table 5) and eps (Table 7), FedBiOT adapter 2 at dropout 0.2.
ABLATION: dict[str, list[str]] = {
    "lambda0": ["fedbiot.align_lambda=0"],
    "lambda0.25": ["fedbiot.align_lambda=0.25"],
    "lambda1": ["fedbiot.align_lambda=1.0"],
    "eps0": ["fedbiot.prox_eps=0"],
    "eps1": ["fedbiot.prox_eps=1.0"],
}


def ablation_markdown(
    cfg: Any, metric: str, variants: dict[str, list[str]], results: dict[str, dict[str, Any]], command: str
) -> str:
    rows = [
        [
            name,
            " ".join(variants[name]) or "(config)",
            layout.seeds_cell(r, f"adapemu/{metric}", 100),
            layout.seeds_cell(r, f"adapfu/{metric}", 100),
            layout.seeds_cell(r, "adapemu/perplexity"),
            layout.seeds_cell(r, "adapfu/perplexity"),
            layout.seeds_cell(r, "adapter_shift", 1, 0),
            layout.seeds_cell(r, "adapter_shift_pct", 1, 0),
            str(r["seeds"]),
        ]
        for name, r in results.items()
        if r.get("seeds")
    ]
    return "\n".join(
        [
            f"# {cfg.name}: ablation of lambda and eps (FedBiOT adapter 2, dropout 0.2), {metric} (%)",
            "",
            f"`{command}`",
            "",
            tables.markdown_table(
                [
                    "variant",
                    "overrides",
                    "AdapEmu",
                    "AdapFu",
                    "AdapEmu ppl",
                    "AdapFu ppl",
                    "adapter shift (L2)",
                    "adapter shift (% of its norm)",
                    "seeds",
                ],
                rows,
            ),
            "",
            "Adapter shift: how far a client moved the adapter it was sent, the L2 norm of the",
            "difference, mean over the round's clients and the trained rounds (the distance eps's",
            "proximal term acts on).",
        ]
    )


def render_ablation(recorded: tables.Recorded) -> str:
    cfg = recorded.cfg
    variants = {"default": [], **ABLATION}
    return ablation_markdown(cfg, primary_metric(cfg), variants, recorded.results, recorded.command)
