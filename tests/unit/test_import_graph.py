"""fedtune's modules import one another without a cycle, counting every import: top-level, inside
functions and under TYPE_CHECKING (each is a dependency a reader has to follow)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in (SRC / "fedtune").rglob("*.py")}
    return {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert "fedtune.config" in graph and "fedtune.plugins" in graph["fedtune.config.experiment"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_plugins_and_config_do_not_import_algorithms() -> None:
    graph = import_graph()
    # plugins reaches only leaves (modules that import nothing of fedtune), so every layer may use it.
    assert {m for m in graph["fedtune.plugins"] if m.startswith("fedtune")} <= {"fedtune.suggest"}
    assert not {m for m in graph["fedtune.suggest"] if m.startswith("fedtune")}
    config = [name for name in graph if name == "fedtune.config" or name.startswith("fedtune.config.")]
    assert "fedtune.config.experiment" in config
    assert not {m for name in config for m in graph[name] if m.startswith("fedtune.algorithms")}


# -- layers: imports point down --------------------------------------------------------------------

LOW_LAYERS = (
    "fedtune.fl",
    "fedtune.train",
    "fedtune.models",
    "fedtune.data",
    "fedtune.eval",
    "fedtune.decode",
    "fedtune.align",
    "fedtune.proxy",
)
APPLICATION = ("fedtune.runner", "fedtune.artifacts", "fedtune.cli", "fedtune.flower", "fedtune.serve")
LAYER_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    # What runs experiments sits above everything that trains, evaluates and federates.
    (LOW_LAYERS, (*APPLICATION, "fedtune.algorithms")),
    # The algorithms sit between the two: they use the low layers and are found by the runner.
    (("fedtune.algorithms",), APPLICATION),
    # Federation transports payloads and may evaluate; evaluation knows nothing of federation.
    (("fedtune.eval",), ("fedtune.fl",)),
)


def within(module: str, packages: tuple[str, ...]) -> bool:
    """``module`` is one of ``packages`` or inside one (``fedtune.flower`` is not in ``fedtune.fl``)."""
    return any(module == package or module.startswith(package + ".") for package in packages)


def layer_violations(
    graph: dict[str, set[str]],
    rules: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = LAYER_RULES,
) -> list[str]:
    """Every ``importer -> imported`` edge some rule forbids, sorted."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for importers, forbidden in rules
        if within(module, importers)
        for imported in imports
        if within(imported, forbidden)
    )


def test_imports_point_down_the_layers() -> None:
    graph = import_graph()
    assert "fedtune.flower.grid" in graph and "fedtune.flower.server_app" in graph
    assert layer_violations(graph) == []


FLOWER_TRANSPORT = ("fedtune.flower.grid", "fedtune.flower.codec")
"""The Flower backend of the Federation contract: it lives in the Flower app's package but sits with
``fedtune.fl``, below the algorithms (the app around it sits above them)."""


def transport_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of the Flower transport that is neither ``fedtune.fl`` nor the transport itself."""
    return sorted(
        f"{module} -> {imported}"
        for module in FLOWER_TRANSPORT
        for imported in graph[module]
        if imported.startswith("fedtune") and not within(imported, ("fedtune.fl", *FLOWER_TRANSPORT))
    )


def test_the_flower_transport_imports_only_the_federation_layer() -> None:
    assert transport_violations(import_graph()) == []


def test_the_transport_rule_finds_an_upward_import() -> None:
    fake = {
        "fedtune.flower.grid": {"fedtune.flower.codec", "fedtune.fl.payload", "fedtune.flower.node"},
        "fedtune.flower.codec": {"fedtune.algorithms.registry", "fedtune.fl"},
    }
    assert transport_violations(fake) == [
        "fedtune.flower.codec -> fedtune.algorithms.registry",
        "fedtune.flower.grid -> fedtune.flower.node",
    ]


def test_the_layer_rule_finds_an_upward_import() -> None:
    fake = {
        # The Flower app inside fl/ reaching up, as it once did.
        "fedtune.fl.flower.server_app": {"fedtune.runner", "fedtune.fl.flower.federation"},
        "fedtune.fl.flower.node": {"fedtune.algorithms.registry", "fedtune.rundata"},
        "fedtune.fl.flower.federation": {"fedtune.fl.payload"},
        "fedtune.eval.evaluate": {"fedtune.fl.payload", "fedtune.models.lora"},
        "fedtune.algorithms.fedit": {"fedtune.artifacts", "fedtune.fl.federation"},
        "fedtune.fl.simulation": {"fedtune.eval.metrics", "fedtune.flowerpot"},
        "fedtune.flower.server_app": {"fedtune.runner", "fedtune.algorithms.registry"},
        "fedtune.train.trainer": {"fedtune.cli"},
        "fedtune.runner": {"fedtune.algorithms.registry", "fedtune.fl.simulation"},
    }
    assert layer_violations(fake) == [
        "fedtune.algorithms.fedit -> fedtune.artifacts",
        "fedtune.eval.evaluate -> fedtune.fl.payload",
        "fedtune.fl.flower.node -> fedtune.algorithms.registry",
        "fedtune.fl.flower.server_app -> fedtune.runner",
        "fedtune.train.trainer -> fedtune.cli",
    ]
    assert layer_violations({"fedtune.fl.flower.federation": {"fedtune.fl.payload"}}) == []


def test_models_import_no_data_training_decoding_or_evaluation() -> None:
    """``models/`` holds models; the pipelines that train, decode or score them live above it."""
    graph = import_graph()
    assert "fedtune.models.surgery" in graph and "fedtune.models.loading" in graph
    above = ("fedtune.data", "fedtune.train", "fedtune.decode", "fedtune.eval")
    assert layer_violations(graph, ((("fedtune.models",), above),)) == []


# -- maths.py: array maths, no models, training, evaluation or files ------------------------------

MATHS_MAY_NOT_IMPORT = ("fedtune.models", "fedtune.train", "fedtune.eval", "fedtune.resources", "peft")
NOT_YET_PURE: dict[str, str] = {}
"""Maths modules that still build models or training: none (FedPT's distillation and FedMKT's transfer
are modules named for what they are)."""


def maths_modules(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if m.startswith("fedtune.algorithms.") and m.endswith(".maths"))


def maths_violations(
    graph: dict[str, set[str]], paths: dict[str, Path] | None = None
) -> dict[str, list[str]]:
    """Each method's ``maths`` -> what it imports of the packages that load models, train, evaluate or
    read files (``peft`` included, which ``import_graph`` does not list)."""
    found = {}
    for module in maths_modules(graph):
        imported = set(graph[module])
        if paths is not None:
            imported |= {name.split(".")[0] for name in all_imports(paths[module])}
        bad = sorted(name for name in imported if within(name, MATHS_MAY_NOT_IMPORT))
        if bad:
            found[module] = bad
    return found


def all_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_every_maths_module_is_array_maths() -> None:
    graph = import_graph()
    paths = {module_name(p): p for p in (SRC / "fedtune").rglob("maths.py")}
    assert {"fedtune.algorithms.perfit.maths", "fedtune.algorithms.fedpft.maths"} <= set(maths_modules(graph))

    violations = maths_violations(graph, paths)

    assert {m: v for m, v in violations.items() if m not in NOT_YET_PURE} == {}
    assert sorted(NOT_YET_PURE) == sorted(violations), "a module in NOT_YET_PURE is pure now: drop it"


def test_the_maths_rule_finds_model_code() -> None:
    fake = {
        "fedtune.algorithms.x.maths": {"fedtune.models.lora", "fedtune.fl.aggregate"},
        "fedtune.algorithms.x.server": {"fedtune.models.lora"},
        "fedtune.algorithms.y.maths": {"fedtune.train.optim"},
    }
    assert maths_violations(fake) == {
        "fedtune.algorithms.x.maths": ["fedtune.models.lora"],
        "fedtune.algorithms.y.maths": ["fedtune.train.optim"],
    }
