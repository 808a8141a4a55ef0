"""The results index and its per-method pages: every relative link resolves to a file of the repository,
and the index links every page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "results.md"
PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """``page:line: target`` for each relative link of ``page`` whose file does not exist."""
    broken = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(root)}:{number}: {target}")
    return broken


def test_results_pages_links_resolve() -> None:
    # Execute
    broken = [link for page in (INDEX, *PAGES) for link in broken_links(page)]
    # Assert
    assert PAGES, "docs/results/ has no page"
    assert not broken, "links to no file:\n" + "\n".join(broken)


def test_results_index_links_every_page() -> None:
    index = INDEX.read_text()
    assert [page.name for page in PAGES if f"(results/{page.name})" not in index] == []


def test_broken_link_is_found(tmp_path: Path) -> None:
    # Prepare: a page beside one real file, linking it and a missing one
    (tmp_path / "here.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](here.md) [gone](missing.md#part) [web](https://example.org)\n")
    # Execute / Assert
    assert broken_links(page, tmp_path) == ["page.md:1: missing.md"]
