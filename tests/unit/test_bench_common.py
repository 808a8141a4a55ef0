"""bench/: the id table, the runner ``python -m bench ID`` and the files a benchmark writes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from bench import __main__ as runner
from bench.common import command_line, sibling, write_table
from bench.ids import BENCHMARKS

BENCH = Path(__file__).resolve().parents[2] / "bench"
HELPERS = {"__init__", "__main__", "common", "ids"}


def test_every_benchmark_script_has_an_id_and_every_id_a_script() -> None:
    scripts = {path.stem for path in BENCH.glob("*.py")} - HELPERS
    assert {benchmark.script for benchmark in BENCHMARKS.values()} == scripts
    for key, benchmark in BENCHMARKS.items():
        assert key == key.lower() and benchmark.measures and benchmark.yardstick, key
        # one id, one results name: a P id's results are named for it
        assert benchmark.results == key or not key.startswith("p"), key


def test_the_runner_runs_the_script_of_an_id_with_its_own_arguments_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, list[str], list[str]]] = []
    for script in ("sft_throughput", "token_align"):
        module = importlib.import_module(f"bench.{script}")
        monkeypatch.setattr(module, "main", lambda args, s=script: calls.append((s, args, sys.argv)))
    monkeypatch.setattr(sys, "argv", ["-m"])

    runner.main(["P3", "--smoke"])
    runner.main(["p2", "--repeats", "1"])

    p2 = ["--only", "p2", "--repeats", "1"]
    assert calls == [
        ("sft_throughput", ["--smoke"], ["bench/sft_throughput.py", "--smoke"]),
        ("token_align", p2, ["bench/token_align.py", *p2]),
    ]
    with pytest.raises(SystemExit, match="no benchmark 'p99'; the ids are: p1, p2"):
        runner.main(["p99"])
    runner.main([])
    listed = capsys.readouterr().out
    assert all(
        f"bench/{b.script}.py -> bench/results/{b.results}.json" in listed for b in BENCHMARKS.values()
    )


def test_a_table_whose_name_holds_a_dot_keeps_its_whole_name(tmp_path: Path) -> None:
    stem = tmp_path / "memory-fedmkt-wic-llm1.5b"
    write_table(stem, "# table", "config.yaml", "python bench/x.py", {"row": {"llm": {"0": 0.5}}})
    assert (tmp_path / "memory-fedmkt-wic-llm1.5b.md").read_text() == "# table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "memory-fedmkt-wic-llm1.5b.json",
        "memory-fedmkt-wic-llm1.5b.md",
    ]
    assert sibling(stem, ".png").name == "memory-fedmkt-wic-llm1.5b.png"


def test_the_command_line_names_the_script_from_the_checkout() -> None:
    assert command_line(str(BENCH / "fedbiot_memory.py"), ["c.yaml", "--set", "a=1"]) == (
        "python bench/fedbiot_memory.py c.yaml --set a=1"
    )
