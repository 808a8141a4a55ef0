"""Smoke test of bench/fedbiot_table.py on the tiny config: runs, resumes nothing twice, tabulates."""

from __future__ import annotations

import json
from pathlib import Path

from bench import fedbiot_memory, fedbiot_table

from tests.integration.helpers import ROOT


def test_table_runs_methods_and_tabulates(tmp_path: Path, capsys: object) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--methods", "offsite", "fedbiot_a2", "--dropouts", "0.4", "--set", "fed.rounds=1"]
    fedbiot_table.main(argv)
    runs = tmp_path / "runs" / "fedbiot-tiny"
    assert (runs / "offsite-d0.4-s0" / "artifacts" / "fedbiot.json").is_file()
    info = json.loads((runs / "fedbiot_a2-d0.4-s0" / "artifacts" / "fedbiot.json").read_text())
    assert info["split"]["adapter"] == [6, 7] and len(info["split"]["emulator"]) == 3
    assert 0 < info["params"]["client_params"] < info["params"]["full_params"]
    assert (tmp_path / "results" / "table-fedbiot-tiny.png").read_bytes().startswith(b"\x89PNG")
    table = (tmp_path / "results" / "table-fedbiot-tiny.md").read_text()
    assert "| Offsite-tuning |" in table and "| FedBiOT (Adapter 2) |" in table and "| FedOT |" not in table
    assert "- d=0.4, AdapFu, 1 seed(s): FedBiOT (Adapter 2)" in table  # the ordering, against Offsite
    results = json.loads((tmp_path / "results" / "table-fedbiot-tiny.json").read_text())["results"]
    assert results["offsite-d0.4"]["seeds"] == 1 and "adapfu/rougeL" in results["fedbiot_a2-d0.4"]
    # A second call finds the finished runs and only tabulates.
    fedbiot_table.main([*argv, "--table-only"])


def test_memory_bench_measures_client_processes_on_flower(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    results_dir = tmp_path / "results"
    fedbiot_memory.main([str(config), "--variants", "fedbiot_a2", "--results-dir", str(results_dir)])
    record = json.loads((results_dir / "memory-fedbiot-tiny.json").read_text())
    results = record["results"]
    assert set(results) == {"baseline", "fedbiot_a2"}
    # Every client process reported its own peak RSS, at least what importing the stack costs.
    measured = results["fedbiot_a2"]
    assert measured["client_peak_mem_mb"] >= 0.5 * results["baseline"]["client_peak_mem_mb"]
    assert measured["mb_down"] > 0
    params = measured["params"]
    assert 0 < params["client_params"] < params["full_params"]
    table = (results_dir / "memory-fedbiot-tiny.md").read_text()
    assert "FedBiOT adapter 2, emulator d=0.2" in table and "no model" in table
