"""Every experiments script whose docstring shows it run as ``python experiments/<name>.py`` runs its
``main`` when so run (a script without the ``__main__`` guard exits 0 having done nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT

SCRIPTS = sorted(
    path
    for path in (ROOT / "experiments").glob("*.py")
    if f"python experiments/{path.name}" in path.read_text()
    and any(
        isinstance(node, ast.FunctionDef) and node.name == "main" for node in ast.parse(path.read_text()).body
    )
)


def runs_main_as_script(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'",):
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
            return any(ast.unparse(call.func) == "main" for call in calls)
    return False


def test_the_table_scripts_are_found() -> None:
    assert {"perfit_table.py", "fedpt_table.py", "fedbiot_table.py", "fedmkt_table.py"} <= {
        p.name for p in SCRIPTS
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_script_runs_its_main(script: Path) -> None:
    assert runs_main_as_script(ast.parse(script.read_text())), (
        f"{script.name}: no `if __name__ == '__main__': main()`"
    )
