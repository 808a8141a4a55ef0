"""Config classes found through ``fedtune.algorithm_configs`` (without their algorithm), and the packages
whose parts load on first use."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import Field

from fedtune import plugins
from fedtune.config import AlgorithmConfig
from fedtune.lazy import lazy_exports


class StepConfig(AlgorithmConfig):
    step: float = Field(0.5, gt=0)


class OtherConfig(AlgorithmConfig):
    pass


class Step:
    name = "step"
    Config = StepConfig


@pytest.fixture
def method_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A method ``step`` in two fake modules: its config alone, and its algorithm (``imported`` counts
    the times the algorithm module is reached)."""
    config_module = types.ModuleType("fake_step_config")
    config_module.StepConfig = StepConfig  # type: ignore[attr-defined]
    config_module.OtherConfig = OtherConfig  # type: ignore[attr-defined]
    algorithm_module = types.ModuleType("fake_step")
    algorithm_module.imported = 0  # type: ignore[attr-defined]

    def __getattr__(name: str) -> type:
        algorithm_module.imported += 1  # type: ignore[attr-defined]
        if name != "Step":
            raise AttributeError(name)
        return Step

    algorithm_module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_step_config", config_module)
    monkeypatch.setitem(sys.modules, "fake_step", algorithm_module)
    monkeypatch.setitem(plugins.BUILTIN, "step", "fake_step:Step")
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(plugins, "_loaded_configs", {})
    yield algorithm_module


def test_a_config_entry_point_gives_the_config_without_loading_the_algorithm(
    method_modules: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(plugins.BUILTIN_CONFIGS, "step", "fake_step_config:StepConfig")

    assert plugins.config_class("step") is StepConfig
    assert method_modules.imported == 0
    assert plugins.algorithm_class("step") is Step


def test_without_a_config_entry_point_the_config_is_the_algorithms(method_modules: types.ModuleType) -> None:
    assert plugins.config_class("step") is StepConfig
    assert method_modules.imported == 1


def test_a_config_entry_point_that_is_not_the_algorithms_config_is_an_error(
    method_modules: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(plugins.BUILTIN_CONFIGS, "step", "fake_step_config:OtherConfig")

    with pytest.raises(TypeError, match=r"fedtune.algorithm_configs names fake_step_config:OtherConfig"):
        plugins.algorithm_class("step")


def test_a_config_entry_point_without_an_algorithm_is_an_unknown_algorithm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(plugins.BUILTIN_CONFIGS, "orphan", "fake_step_config:StepConfig")

    with pytest.raises(plugins.UnknownAlgorithm, match="unknown algorithm 'orphan'"):
        plugins.config_class("orphan")


@pytest.mark.parametrize("name", sorted(plugins.BUILTIN))
def test_every_built_in_config_entry_point_is_its_algorithms_config(name: str) -> None:
    assert plugins.config_class(name) is plugins.algorithm_class(name).Config


LAZY_PACKAGES = [f"fedtune.algorithms.{name}" for name in sorted(plugins.BUILTIN)] + ["fedtune.proxy"]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_name_a_lazy_package_exports_loads(package: str) -> None:
    module = importlib.import_module(package)

    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_lazy_exports_import_the_module_on_first_access() -> None:
    getter = lazy_exports("pkg", {"dumps": "json", "missing": "json"})

    assert getter("dumps") is importlib.import_module("json").dumps
    with pytest.raises(AttributeError):
        getter("missing")
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getter("loads")


def test_the_built_in_methods_are_the_entry_points_of_the_source_trees_pyproject() -> None:
    assert plugins.BUILTIN["fedpft"] == "fedtune.algorithms.fedpft:FedPFT"
    assert plugins.BUILTIN_CONFIGS["fedpft"] == "fedtune.algorithms.fedpft.config:FedPFTConfig"


def test_entry_points_are_read_only_from_fedtunes_own_pyproject(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.toml", tmp_path / "theirs.toml"
    group = '[project.entry-points."fedtune.algorithms"]\nstep = "fake_step:Step"\n'
    ours.write_text(f'[project]\nname = "fedtune"\n\n{group}')
    theirs.write_text(f'[project]\nname = "mypackage"\n\n{group}')

    assert plugins.source_tree_entry_points(ours) == {plugins.GROUP: {"step": "fake_step:Step"}}
    assert plugins.source_tree_entry_points(theirs) == {}
    assert plugins.source_tree_entry_points(tmp_path / "installed.toml") == {}
