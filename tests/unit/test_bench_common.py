"""bench/common.py: the files a table script writes."""

from __future__ import annotations

from pathlib import Path

from bench.common import earlier_results, sibling, write_table


def test_a_table_whose_name_holds_a_dot_keeps_its_whole_name(tmp_path: Path) -> None:
    stem = tmp_path / "table-fedmkt-wic-llm1.5b"
    write_table(stem, "# table", "config.yaml", "python bench/x.py", {"row": {"llm": {"0": 0.5}}})
    assert (tmp_path / "table-fedmkt-wic-llm1.5b.md").read_text() == "# table\n"
    assert earlier_results(stem) == {"row": {"llm": {"0": 0.5}}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "table-fedmkt-wic-llm1.5b.json",
        "table-fedmkt-wic-llm1.5b.md",
    ]
    assert sibling(stem, ".png").name == "table-fedmkt-wic-llm1.5b.png"
