"""Algorithm discovery: the entry-point group ``fedtune.algorithms`` maps a name to a class.

A method written outside this repository is one module plus one line in its own pyproject::

    [project.entry-points."fedtune.algorithms"]
    fedadam = "mypackage.fedadam:FedAdam"

A method may also name its config class in the group ``fedtune.algorithm_configs``::

    [project.entry-points."fedtune.algorithm_configs"]
    fedadam = "mypackage.fedadam_config:FedAdamConfig"

Validating a config then imports only that module, not the method's model code (torch, transformers):
``fedtune run`` reports a misspelt key in a fraction of a second. Without it, the config class is the
algorithm class's ``Config``.

The built-in methods are entry points of fedtune's own ``pyproject.toml`` like any other, and that
file is their only list: run from the source tree, they are read from it as well (``BUILTIN``), so
a tree that was never installed (``PYTHONPATH=src``, no distribution metadata) finds them too.

``register`` adds a class at run time (a notebook, a test). This module imports nothing of fedtune
but ``fedtune.suggest`` (which imports nothing of fedtune), so every layer may look algorithms up
without an import cycle; loading one imports its module.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from fedtune.suggest import closest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GROUP = "fedtune.algorithms"
CONFIG_GROUP = "fedtune.algorithm_configs"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
"""fedtune's own ``pyproject.toml``, where fedtune runs from its source tree (absent when installed)."""


def source_tree_entry_points(pyproject: Path = PYPROJECT) -> dict[str, dict[str, str]]:
    """Group -> name -> target: the entry points fedtune's ``pyproject`` declares, the built-in methods
    among them, found even when the source tree was never installed (``PYTHONPATH=src``, no
    distribution metadata); {} without one (an installed fedtune: its metadata holds them) or when it
    is another project's."""
    if not pyproject.is_file():
        return {}
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != "fedtune":
        return {}
    return {group: dict(points) for group, points in project.get("entry-points", {}).items()}


# The built-in methods as the source tree declares them; the installed entry points merge over these.
_SOURCE_TREE = source_tree_entry_points()
BUILTIN = _SOURCE_TREE.get(GROUP, {})
BUILTIN_CONFIGS = _SOURCE_TREE.get(CONFIG_GROUP, {})

_registered: dict[str, type] = {}
_loaded: dict[str, type] = {}
_loaded_configs: dict[str, type] = {}

T = TypeVar("T", bound=type)


class UnknownAlgorithm(KeyError):
    """No algorithm of that name is registered; the message lists the ones that are."""

    def __str__(self) -> str:
        return str(self.args[0])


def register(cls: T) -> T:
    """Make ``cls`` (an Algorithm subclass with a ``name``) available by that name in this process."""
    _registered[cls.name] = cls  # type: ignore[attr-defined]
    _loaded.pop(cls.name, None)  # type: ignore[attr-defined]
    return cls


def _targets(group: str = GROUP, builtin: dict[str, str] = BUILTIN) -> dict[str, str]:
    found = dict(builtin)
    found.update({ep.name: ep.value for ep in entry_points(group=group)})
    return found


def _load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def algorithm_names() -> list[str]:
    return sorted(set(_targets()) | set(_registered))


def algorithm_class(name: str) -> Any:
    """The class registered as ``name``: loaded from its entry point on first use."""
    if name in _registered:
        return _registered[name]
    if name in _loaded:
        return _loaded[name]
    targets = _targets()
    if name not in targets:
        names = algorithm_names()
        close = closest(name, names)
        hint = f" (did you mean '{close}'?)" if close else ""
        raise UnknownAlgorithm(f"unknown algorithm {name!r}{hint}; registered: {', '.join(names)}")
    cls = _load(targets[name])
    if getattr(cls, "name", None) != name:
        raise TypeError(
            f"entry point {name!r} of group {GROUP} names {targets[name]}, whose name is {cls.name!r}"
        )
    config_target = _targets(CONFIG_GROUP, BUILTIN_CONFIGS).get(name)
    if config_target is not None and _load(config_target) is not cls.Config:
        raise TypeError(
            f"entry point {name!r} of group {CONFIG_GROUP} names {config_target}, "
            f"but {targets[name]}.Config is {cls.Config.__module__}.{cls.Config.__qualname__}"
        )
    _loaded[name] = cls
    return cls


def config_class(name: str) -> Any:
    """The config class of the algorithm registered as ``name``, loaded without its algorithm class
    when the group ``fedtune.algorithm_configs`` names it."""
    if name in _registered:
        return _registered[name].Config  # type: ignore[attr-defined]
    if name in _loaded_configs:
        return _loaded_configs[name]
    config_target = _targets(CONFIG_GROUP, BUILTIN_CONFIGS).get(name)
    if config_target is None or name not in _targets():
        _loaded_configs[name] = algorithm_class(name).Config
    else:
        _loaded_configs[name] = _load(config_target)
    return _loaded_configs[name]
