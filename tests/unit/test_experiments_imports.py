"""The scripts under experiments/ import one another without a cycle, counting every import: top-level and
inside functions (a side study that imports its table script, imported back inside ``main()``, is a cycle
a reader still has to follow). The arrows run table script -> side study -> the method's shared rows."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_import_graph import cycles, imports_of

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = [*EXPERIMENTS.glob("*.py"), *(EXPERIMENTS / "tables").glob("*.py")]
    paths = {module_name(p): p for p in files}
    return {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}


def test_the_experiment_scripts_import_one_another_without_a_cycle() -> None:
    graph = import_graph()
    # the graph sees the table scripts' imports, at the top and inside functions, and the tables package's
    assert "experiments.tables" in graph["experiments.fedpft_table"]
    assert "experiments.fedbiot_trajectory" in graph["experiments.fedbiot_table"]
    assert "experiments.tables.layout" in graph["experiments.fedpt_table"]
    assert cycles(graph) == []


def test_imports_of_counts_an_import_inside_a_function(tmp_path: Path) -> None:
    # Prepare: a module importing one name at the top and one module inside a function
    path = tmp_path / "m.py"
    path.write_text("from a import b, c\n\n\ndef f():\n    from experiments import d\n")
    # Execute
    found = imports_of(path, {"a", "a.b", "experiments.d", "experiments.e"})
    # Assert
    assert found == {"a", "a.b", "experiments.d"}
