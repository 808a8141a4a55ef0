"""Smoke test of bench/fedmkt_table.py on the tiny config: the one-to-one setting's runs, the table and
its machine-readable results."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from bench import fedmkt_table

from tests.integration.helpers import ROOT


def test_table_runs_the_one_to_one_setting_and_saves_its_numbers(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "configs" / "test" / "fedmkt-tiny.yaml").read_text())
    raw["fed"]["rounds"] = 1
    raw["eval"]["max_new_tokens"] = 4
    config = tmp_path / "fedmkt-tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--settings", "one", "--datasets", "instruct", "--jobs", "2"]

    fedmkt_table.main(argv)

    table = (tmp_path / "results" / "table-fedmkt-tiny.md").read_text()
    assert "## instruct, one (rougeL)" in table
    for label in ("Zero-shot", "Standalone", "Centralized", "LLM2SLM", "FedMKT"):
        assert f"| {label} |" in table
    results = json.loads((tmp_path / "results" / "table-fedmkt-tiny.json").read_text())["results"]
    cells = results["instruct-one"]
    slm = raw["fedmkt"]["clients"][0]
    for row in ("zeroshot", "fedmkt", "llm2slm", "centralized"):
        assert len(cells[row]["llm"]) == 1 and 0.0 <= cells[row]["llm"][0] <= 1.0, row
        assert len(cells[row][slm]) == 1, row
    assert "llm" not in cells["standalone"] and len(cells["standalone"][slm]) == 1
    assert cells["fedmkt"]["mb_up"][0] > 0
