"""experiments/unequal_table.py: what it reads off runs, the lr it picks, the rows it runs, its claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiments import unequal_table
from experiments.unequal_rows import ROWS, SEARCH


def _run(path: Path, final: float, rounds: int = 2) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"fed:\n  rounds: {rounds}\n")
    trained = [
        {
            "round": r,
            "clients": ["c00", "c01"],
            "bytes_up": 2000 * r,
            "bytes_down": 4000,
            "client_seconds": 3.0,
        }
        for r in range(1, rounds + 1)
    ]
    trained[-1]["eval"] = {"perplexity": final}
    rows = [{"round": 0, "eval": {"perplexity": 20.0}}, *trained]
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_row_is_its_final_perplexity_over_seeds_and_a_clients_traffic(tmp_path: Path) -> None:
    runs = [_run(tmp_path / "fedit-s0", 10.0), _run(tmp_path / "fedit-s1", 12.0), tmp_path / "fedit-s2"]
    out = unequal_table.summarise(runs)
    assert out["seeds"] == 2  # seed 2 never ran
    assert out["perplexity_by_seed"] == {"0": 10.0, "1": 12.0}
    assert out["perplexity_std"] == pytest.approx(2**0.5)  # the sample std, not the population one (1.0)
    # per client: rounds 1 and 2 sent 2000 and 4000 bytes over 2 clients
    assert out["kb_up_per_client"] == pytest.approx(1.5)
    assert out["kb_down_per_client"] == pytest.approx(2.0)
    assert out["client_seconds"] == pytest.approx(1.5)


def test_the_chosen_lr_is_the_lowest_validation_perplexity_of_a_finished_grid() -> None:
    grid = SEARCH["fedadam"][1]
    # the lowest perplexity is at the grid's last lr
    results = {unequal_table.search_key("fedadam", lr): {"perplexity": 9.0 - i} for i, lr in enumerate(grid)}
    results[unequal_table.search_key("fedyogi", SEARCH["fedyogi"][1][0])] = {
        "perplexity": 1.0
    }  # grid unfinished
    assert unequal_table.chosen(results) == {"fedadam": grid[-1]}


def test_a_searched_row_runs_at_its_chosen_lr_and_is_left_out_without_one() -> None:
    rows, stems, missing = unequal_table.final_rows(["fedopt"], {"fedadam": 0.003})
    assert rows["fedit"] == ROWS["fedit"] and "fedit" not in stems
    assert rows["fedadam"] == [*ROWS["fedadam"], "fedadam.server_lr=0.003"]
    assert stems["fedadam"] == "fedadam-lr0.003"
    assert missing == ["fedyogi", "fedadagrad"]


def test_a_claim_reads_lower_perplexity_as_better() -> None:
    results = {
        "fedit_r4": {"perplexity": 9.0, "perplexity_by_seed": {"0": 9.0, "1": 10.0, "2": 11.0}},
        "hetlora": {"perplexity": 8.0, "perplexity_by_seed": {"0": 8.0, "1": 9.1, "2": 9.9}},
    }
    lines = unequal_table.claim_lines("ranks", results)
    assert lines == [
        "- HetLoRA beats FedIT at the smallest rank: holds (gain 1.000, 95% CI [0.752, 1.248], 3 seeds)"
    ]
