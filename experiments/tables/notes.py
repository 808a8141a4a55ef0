"""The notes that close a table's .md: what ``--keep-earlier`` kept, every reply its runs' servers
rejected (such a row is not the method's plain average), and runs that computed at different CPU thread
counts."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.common import sibling

from experiments.tables.runs import read_rows, saved_value


def rejected_replies(run_dir: Path) -> list[tuple[int, str, str]]:
    """(round, client, the server's reason) for every reply the run's server rejected (``fed.screen``,
    ``fed.norm_bound``, a reply failing its checks), in round order; [] for a run not here."""
    return [
        (int(row["round"]), str(client), str(reason))
        for row in read_rows(run_dir)
        for client, reason in (row.get("rejected") or {}).items()
    ]


REJECTED_HEAD = "Replies the server rejected, left out of their round's aggregate (run, round, client: why):"
FROM_EARLIER = " (previous results file)"


def rejected_note(run_dirs: Iterable[Path], under: Path | None = None, earlier: Path | None = None) -> str:
    """A table's note naming each reply its runs' servers rejected: such a row is not the method's plain
    average over the round's clients (the default median screen can turn away an honest client whose
    update diverged). A run is named by its directory's name, or by its path under ``under`` where runs
    of one name live in several directories. "" when no run rejected any.

    ``earlier`` (``--keep-earlier``: the table's stem): a run of the table that is not here (made on
    another machine; its values kept from the previous write) keeps the lines the previous ``<stem>.md``
    gave it, marked as such; a run here is always read again."""

    def name(run_dir: Path) -> str:
        return run_dir.name if under is None else run_dir.relative_to(under).as_posix()

    kept = earlier_rejections(earlier) if earlier is not None else None
    lines = []
    for run_dir in run_dirs:
        if kept is not None and not read_rows(run_dir):
            lines += [line for line in kept if line.startswith(f"- {name(run_dir)}, round ")]
        else:
            replies = rejected_replies(run_dir)
            lines += [f"- {name(run_dir)}, round {rnd}, {client}: {why}" for rnd, client, why in replies]
    if not lines:
        return ""
    return "\n\n" + REJECTED_HEAD + "\n\n" + "\n".join(lines) + "\n"


def earlier_rejections(stem: Path) -> list[str]:
    """The lines of the previous ``<stem>.md``'s rejection note (read once a table), marked as kept."""
    path = sibling(stem, ".md")
    if not path.is_file():
        return []
    text = path.read_text()
    if REJECTED_HEAD not in text:
        return []
    note = text.split(REJECTED_HEAD, 1)[1].lstrip("\n").split("\n\n", 1)[0]  # the list under the heading
    return [
        line if line.endswith(FROM_EARLIER) else line + FROM_EARLIER
        for line in note.splitlines()
        if line.startswith("- ")
    ]


def kept_seeds_note(kept: Mapping[str, list[str]]) -> str:
    """The line a table adds for the seeds ``keep_earlier_seeds`` kept, per row under the name given."""
    if not kept:
        return ""
    rows = "; ".join(f"{name}: {', '.join(seeds)}" for name, seeds in kept.items())
    return f"\n\nSeeds kept from the previous results file (their runs not here, `--keep-earlier`): {rows}.\n"


def kept_rows_note(names: list[str]) -> str:
    """The line a table adds for the rows ``keep_earlier_rows`` kept, each under the name given."""
    if not names:
        return ""
    rows = ", ".join(names)
    return f"\n\nKept from the previous results file (no run of theirs here, `--keep-earlier`): {rows}.\n"


def closing_notes(
    dirs: Mapping[Any, Iterable[Path]],
    stem: Path,
    args: argparse.Namespace,
    *,
    kept_rows: list[str] | None = None,
    kept_seeds: Mapping[str, list[str]] | None = None,
) -> str:
    """What closes a table's .md: the rows and seeds ``--keep-earlier`` kept (`kept_rows_note`,
    `kept_seeds_note`, each under the name given) and the replies the servers of the runs of ``dirs``
    (row -> run directories) rejected, those of runs not here from the previous ``<stem>.md`` with
    ``--keep-earlier``."""
    keep = getattr(args, "keep_earlier", False)
    runs = [run_dir for row_dirs in dirs.values() for run_dir in row_dirs]
    rejected = rejected_note(runs, earlier=stem if keep else None)
    return kept_rows_note(kept_rows or []) + kept_seeds_note(kept_seeds or {}) + rejected + threads_note(runs)


THREADS_HEAD = "Runs that computed at different CPU thread counts"


def run_threads(run_dir: Path) -> int | None:
    """The CPU thread count a run computed with, as its ``config.yaml`` records it (``_run.threads``);
    None for a run not here or made before runs recorded it."""
    threads = saved_value(run_dir, "_run.threads")
    return None if threads is None else int(threads)


def threads_note(run_dirs: Iterable[Path]) -> str:
    """A table's note where its runs computed at different thread counts: the count orders float sums,
    so a run on the edge of divergence can go either way at another count. The runs by count; "" where
    every run that recorded one agrees."""
    by_count: dict[int, list[str]] = {}
    for run_dir in run_dirs:
        threads = run_threads(run_dir)
        if threads is not None:
            by_count.setdefault(threads, []).append(run_dir.name)
    if len(by_count) < 2:
        return ""
    counts = "; ".join(f"{n} thread(s): {', '.join(names)}" for n, names in sorted(by_count.items()))
    return (
        f"\n\n{THREADS_HEAD} (the count orders float sums: a run on the edge of divergence can go either "
        f"way at another): {counts}.\n"
    )


# What a table's .md holds that its .json does not: notes on the runs found (kept from an earlier file,
# rejected replies, thread counts). They close the .md; --render keeps them as the .md beside the .json
# has them.
RUN_NOTES = (
    "\n\nKept from the previous results file",
    "\n\nSeeds kept from the previous results file (their runs not here",
    "\n\n" + REJECTED_HEAD,
    "\n\n" + THREADS_HEAD,
)


def run_notes(markdown: str) -> str:
    """The notes that close a table's .md (from the first of `RUN_NOTES` on); "" for none."""
    found = [markdown.find(head) for head in RUN_NOTES if head in markdown]
    return markdown[min(found) :] if found else ""
