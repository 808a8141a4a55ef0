"""The rows of `experiments/unequal_table.py` (clients of unequal means), its studies and their searches.

Every row is the table's config (FedIT's LoRA, rank 8, on SmolLM2-135M-Instruct) with overrides. LoRA's
scaling alpha / r is 2 in every row, so a rank changes capacity, not the step size.
"""

from __future__ import annotations

RANKS = "[4,8,16]"
ROWS: dict[str, list[str]] = {
    "fedit": [],
    "fedit_r4": ["lora.r=4", "lora.alpha=8"],
    "fedit_r16": ["lora.r=16", "lora.alpha=32"],
    "hetlora": ["algorithm=hetlora", "lora.r=16", "lora.alpha=32", f"hetlora.ranks={RANKS}"],
    "flexlora": ["algorithm=flexlora", "lora.r=16", "lora.alpha=32", f"flexlora.ranks={RANKS}"],
    "fedavgm": ["algorithm=fedavgm"],
    "fedadam": ["algorithm=fedadam"],
    "fedyogi": ["algorithm=fedyogi"],
    "fedadagrad": ["algorithm=fedadagrad"],
    "fedkseed": ["algorithm=fedkseed"],
}
LABELS = {
    "fedit": "FedIT (FedAvg), rank 8",
    "fedit_r4": "FedIT, rank 4 everywhere (the weakest client's)",
    "fedit_r16": "FedIT, rank 16 everywhere (the strongest client's)",
    "hetlora": "HetLoRA, ranks 4/8/16",
    "flexlora": "FlexLoRA, ranks 4/8/16",
    "fedavgm": "FedAvgM (beta 0.9, server lr 1)",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "fedkseed": "FedKSeed (full model, zeroth order)",
}
STUDIES: dict[str, list[str]] = {
    "ranks": ["fedit_r4", "hetlora", "flexlora", "fedit_r16"],
    "fedopt": ["fedit", "fedavgm", "fedadam", "fedyogi", "fedadagrad"],
    "kseed": ["fedit", "fedkseed"],
}
"""Each study's rows, in the table's order."""

SEARCH: dict[str, tuple[str, list[float]]] = {
    "fedadam": ("fedadam.server_lr", [1e-3, 1e-2, 1e-1]),
    "fedyogi": ("fedyogi.server_lr", [1e-3, 1e-2, 1e-1]),
    "fedadagrad": ("fedadagrad.server_lr", [1e-3, 1e-2, 1e-1]),
    "fedkseed": ("fedkseed.lr", [3e-6, 3e-5]),
}
"""The rows whose own learning rate is searched (on the validation split, seed 0), and the grid, values
a decade apart (what 2 CPU cores allow): the server lr of the adaptive optimisers (the paper grid-searches
it per task; our default is 1e-2; 1e-1 was added when 1e-2 came out best of 1e-3 and 1e-2, so that the
choice is not at the grid's edge), FedKSeed's step size (10x and 100x its paper's 3e-7: here a client
takes 5 steps a round, where the paper's take hundreds)."""

CLAIMS: dict[str, list[tuple[str, str, str]]] = {
    "ranks": [
        ("fedit_r4", "hetlora", "HetLoRA beats FedIT at the smallest rank"),
        ("fedit_r4", "flexlora", "FlexLoRA beats FedIT at the smallest rank"),
        ("hetlora", "flexlora", "FlexLoRA beats HetLoRA"),
    ],
    "fedopt": [
        ("fedit", "fedadam", "FedAdam beats FedAvg"),
        ("fedit", "fedyogi", "FedYogi beats FedAvg"),
        ("fedit", "fedadagrad", "FedAdagrad beats FedAvg"),
        ("fedavgm", "fedadam", "FedAdam beats FedAvgM"),
        ("fedavgm", "fedyogi", "FedYogi beats FedAvgM"),
    ],
    "kseed": [("fedkseed", "fedit", "FedIT-LoRA beats FedKSeed (the paper: comparable)")],
}
"""Each study's claims as (worse, better, what it says): the better row's perplexity is lower."""
