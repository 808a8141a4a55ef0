"""Smoke test of bench/perfit_table.py on the tiny config: runs two rows, tabulates, plots the masks."""

from __future__ import annotations

import json
from pathlib import Path

from bench import perfit_table

from tests.integration.helpers import ROOT


def test_table_runs_rows_tabulates_and_plots_masks(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--rows", "fit", "standalone", "perfit_s0.5", "--jobs", "2"]
    argv += ["--set", "fed.rounds=1", "--set", "eval.metrics=[perplexity,rougeL]"]
    perfit_table.main(argv)
    table = (tmp_path / "results" / "table-perfit-tiny.md").read_text()
    assert "| FIT (FedIT, rank r) | pathological |" in table and "| PerFIT s = 0.5 | pathological |" in table
    assert "| Standalone (rank r, own data only) | pathological |" in table
    assert "- pathological, PerFIT s = 0.5 < FIT:" in table and "personal Rouge-L" in table
    results = json.loads((tmp_path / "results" / "table-perfit-tiny.json").read_text())["results"]
    assert results["perfit_s0.5-pathological"]["seeds"] == 1
    assert len(results["perfit_s0.5-pathological"]["by_client"]) == 4
    for row in ("fit", "standalone", "perfit_s0.5"):
        assert set(results[f"{row}-pathological"]["personal/rougeL_by_seed"]) == {"0"}
    masks = results["masks"]
    assert masks["modules"] == ["k_proj", "q_proj", "v_proj"] and len(masks["overlap"]) == 4
    assert (tmp_path / "results" / "table-perfit-tiny-masks.png").read_bytes().startswith(b"\x89PNG")
    perfit_table.main([*argv, "--table-only"])
