"""``--render RESULTS_JSON``: rewrite a table's ``.md`` from its ``.json`` alone (the numbers, and the
options of the command it records), keeping the notes on runs that close the ``.md`` beside it."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.tables.notes import run_notes
from experiments.tables.runs import RESULTS_DIR, load_config


@dataclass(frozen=True)
class Recorded:
    """A table as its results file recorded it: the options of its command, the config they load, its
    numbers, the command, and the .md written beside it ("" for none)."""

    args: argparse.Namespace
    cfg: Any
    results: Any
    command: str
    markdown: str


Renderer = Callable[[Recorded], str]


def stamp_of(recorded: Recorded) -> str | None:
    """The time the .md beside the results file says it was made (after its command); None for none."""
    head = f"`{recorded.command}` — "
    line = next((line for line in recorded.markdown.splitlines() if line.startswith(head)), None)
    return None if line is None else line.removeprefix(head)


def command_args(command: str, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The options of a results file's recorded ``command`` (``python <script> ...``), parsed by
    ``parser`` (the script's own)."""
    return parser.parse_args(shlex.split(command)[2:])  # after "python <script>"


def recorded_command(path: Path, parser: argparse.ArgumentParser) -> tuple[Any, str, argparse.Namespace]:
    """The results file ``path``'s record, its recorded command and that command's options (``parser``),
    refusing a command that no longer parses."""
    record = json.loads(path.read_text())
    command = str(record["command"])
    try:
        return record, command, command_args(command, parser)
    except SystemExit as error:
        raise SystemExit(f"{path}: its command no longer parses (above): {command}") from error


def write_rendered(path: Path, out: Path, text: str) -> Path:
    """The rendered ``text`` written as the .md of the results file ``path``, in the directory ``out``."""
    target = out / path.with_suffix(".md").name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text if text.endswith("\n") else text + "\n")
    return target


def render(path: Path, parser: argparse.ArgumentParser, renderers: Mapping[str, Renderer], out: Path) -> Path:
    """``--render``: rewrite the .md of the results file ``path`` into the directory ``out``, from the
    file's numbers alone. Its recorded command gives the options (parsed by ``parser``); the renderer is
    the one of ``renderers`` (file name prefix -> renderer) whose prefix is the longest that the file's
    name starts with. Nothing is run and no run directory is read; the notes on runs that close the .md
    beside it are kept as they are (`run_notes`)."""
    prefixes = [prefix for prefix in renderers if path.name.startswith(prefix)]
    if not prefixes:
        raise SystemExit(f"{path}: no table of this script is named so (one of {', '.join(renderers)}*)")
    record, command, args = recorded_command(path, parser)
    if args.config is not None and not args.config.is_absolute():  # as given in the checkout's root
        args.config = RESULTS_DIR.parents[1] / args.config
    before = path.with_suffix(".md")
    markdown = before.read_text() if before.is_file() else ""
    recorded = Recorded(args, load_config(args), record["results"], command, markdown)
    try:
        text = renderers[max(prefixes, key=len)](recorded) + run_notes(markdown)
    except (KeyError, TypeError, ValueError) as error:
        why = f"{type(error).__name__}: {error}"
        raise SystemExit(f"{path}: these results lack what the table shows today ({why})") from error
    return write_rendered(path, out, text)
