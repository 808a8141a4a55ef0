"""The docs stay true to the code and the README stays a front door.

- ``docs/config.md`` is what ``scripts/config_reference.py`` writes from the config classes, every key
  documented beside its field;
- the README is short, its lines fit, it opens with the two setup commands and lists every command;
- the repository names no file outside it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from fedtune.config import AlgorithmConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "config.md"
REGENERATE = "python scripts/config_reference.py"
# Written in pieces so that this file does not name them itself.
OUTSIDE = ("../" + "shared", "METHODS" + ".md", "BENCHMARKS" + ".md")


def config_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "scripts" / "config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: only the installed methods, not one a test registered in this process
    import fedtune.plugins

    monkeypatch.setattr(fedtune.plugins, "_registered", {})
    # Execute
    expected = config_reference().render()
    # Assert
    committed = CONFIG_DOC.read_text() if CONFIG_DOC.is_file() else ""
    assert committed == expected, f"docs/config.md is out of date with the config classes: run `{REGENERATE}`"


class BareConfig(AlgorithmConfig):
    steps: int = 1


class Bare:
    name = "bare"
    Config = BareConfig


def test_config_reference_refuses_a_key_without_documentation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a method whose config key has no text beside its field
    import fedtune.plugins

    module = config_reference()
    monkeypatch.setitem(fedtune.plugins._registered, "bare", Bare)
    # Execute / Assert
    with pytest.raises(module.Undocumented, match=r"bare\.steps"):
        module.render(["bare"])


def test_config_reference_lines_fit() -> None:
    long = [n for n, line in enumerate(CONFIG_DOC.read_text().splitlines(), 1) if len(line) > 120]
    assert not long, f"docs/config.md lines over 120 characters: {long}"


def test_readme_is_short_and_its_lines_fit() -> None:
    lines = README.read_text().splitlines()
    long = [n for n, line in enumerate(lines, 1) if len(line) > 120]
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200: move detail into docs/)"
    assert not long, f"README.md lines over 120 characters: {long}"


def test_readme_opens_with_the_two_setup_commands() -> None:
    text = README.read_text()
    first_block = re.search(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)
    assert first_block is not None, "README.md has no code block"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert "bash scripts/demo.sh" in commands
    assert "bash .ci/run" in commands


def test_readme_and_the_docs_index_link_every_docs_page() -> None:
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    readme = README.read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    assert [page for page in pages if f"(docs/{page}" not in readme] == []
    assert [page for page in pages if page != "index.md" and f"({page}" not in index] == []


def command_paths() -> list[tuple[str, ...]]:
    """Every ``fedtune`` command and subcommand, as name paths (``("flower", "submit")``)."""
    import click
    import typer

    from fedtune.cli import app

    def walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        if isinstance(command, click.Group):
            return [p for name, sub in command.commands.items() for p in walk(sub, (*path, name))]
        return [path]

    return walk(typer.main.get_command(app), ())


def test_readme_lists_every_command() -> None:
    lines = README.read_text().splitlines()
    missing = []
    for path in command_paths():
        # `fedtune run`, or `fedtune flower` with `keygen` later on the line (`certs|keygen|...`)
        group = " ".join(("fedtune", *path[:-1]))
        name = re.escape(path[-1])
        pattern = re.compile(rf"{group} {name}\b" if len(path) == 1 else rf"{group}\b.*\b{name}\b")
        if not any(pattern.search(line) for line in lines):
            missing.append(" ".join(path))
    assert not missing, f"README.md does not show these commands: {missing}"


def repository_files() -> list[Path]:
    """Tracked files and new files git does not ignore (what a commit would hold)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {name}" for name in OUTSIDE if name in line]
    assert not found, "files name files outside the repository:\n" + "\n".join(found)


def _tour_runs() -> dict[str, list[str]]:
    """The README's ``fedtune run`` lines: output directory -> config and overrides (what the job is)."""
    runs = {}
    for line in README.read_text().splitlines():
        words = line.split("#")[0].split()
        if words[:2] == ["fedtune", "run"] and "-o" in words:
            out = words[words.index("-o") + 1]
            kept = [w for w in words[2:] if w not in ("-o", out, "--backend") and w not in ("flower", "ray")]
            runs[out] = kept
    return runs


def test_readme_compares_runs_of_the_same_job() -> None:
    runs = _tour_runs()
    lines = [line.split("#")[0].split() for line in README.read_text().splitlines()]
    compared = [words for words in lines if words[:2] == ["fedtune", "report"] and "--compare" in words[3:4]]
    assert compared, "README.md no longer shows `fedtune report ... --compare ...`"
    for words in compared:
        first, second = words[2], words[words.index("--compare") + 1]
        assert runs[first] == runs[second], (
            f"README.md compares {first} {runs[first]} with {second} {runs[second]}"
        )
