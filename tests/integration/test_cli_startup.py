"""The `fedtune` commands that need no model start without importing torch, transformers, flwr or peft:
every command's ``--help``, a config with a misspelt key, ``models list`` and ``data list``.

Each check runs in a fresh interpreter (this process has imported them all already) and asks which
heavy modules are loaded after each command; ``bench/cli_startup.py`` times the same commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.helpers import ROOT

HEAVY = ("torch", "transformers", "flwr", "peft", "datasets", "ray")

# Runs each command (argv lists on stdin) in-process and reports its exit code, its output and the heavy
# modules loaded after it.
PROBE = """
import contextlib, io, json, sys
from fedtune.cli import app
heavy, report = json.loads(sys.argv[1]), []
for argv in json.loads(sys.stdin.read()):
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            app(argv, prog_name="fedtune")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    loaded = [name for name in heavy if name in sys.modules]
    report.append({"argv": argv, "code": code, "output": output.getvalue(), "loaded": loaded})
print(json.dumps(report))
"""


def probe(commands: list[list[str]], cwd: Path = ROOT) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY)],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout)


def help_commands() -> list[list[str]]:
    """``--help`` of the command, of every group and of every command in them."""
    import click
    import typer

    found: list[list[str]] = [["--help"]]

    def walk(group: click.Group, path: list[str]) -> None:
        for name, command in sorted(group.commands.items()):
            found.append([*path, name, "--help"])
            if isinstance(command, click.Group):
                walk(command, [*path, name])

    from fedtune.cli import app

    root = typer.main.get_command(app)
    assert isinstance(root, click.Group)
    walk(root, [])
    return found


def test_every_help_imports_no_heavy_module() -> None:
    commands = help_commands()
    assert ["flower", "superlink", "--help"] in commands and ["models", "derive", "--help"] in commands
    for result in probe(commands):
        assert result["code"] == 0, result
        assert "Usage" in result["output"], result
        assert result["loaded"] == [], f"fedtune {' '.join(result['argv'])} imported {result['loaded']}"


def test_a_misspelt_key_listing_models_and_data_import_no_heavy_module(tmp_path: Path) -> None:
    config = str(ROOT / "configs" / "test" / "fedit-tiny.yaml")
    misspelt, models, data = probe(
        [
            ["run", config, "fed.round=3"],
            ["models", "list", "--cache-dir", str(tmp_path)],
            ["data", "list"],
        ]
    )
    assert misspelt["code"] == 2
    assert "unknown config key 'fed.round' (did you mean 'fed.rounds'?)" in misspelt["output"]
    assert "smollm2-135m-instruct" in models["output"].lower() and models["code"] == 0
    assert "wordnet-instruct" in data["output"] and data["code"] == 0
    for result in (misspelt, models, data):
        assert result["loaded"] == [], f"fedtune {' '.join(result['argv'])} imported {result['loaded']}"


def test_every_built_in_method_validates_its_section_without_heavy_modules() -> None:
    from fedtune.plugins import BUILTIN

    commands = [
        ["run", str(ROOT / "configs" / "test" / f"{name}-tiny.yaml"), f"{name}.no_such_key=1"]
        for name in sorted(BUILTIN)
    ]
    for result, name in zip(probe(commands), sorted(BUILTIN), strict=True):
        assert result["code"] == 2 and f"unknown config key '{name}.no_such_key'" in result["output"], result
        assert result["loaded"] == [], f"validating {name}'s section imported {result['loaded']}"
