"""Algorithm discovery: the entry-point group ``fedtune.algorithms`` maps a name to a class.

A method written outside this repository is one module plus one line in its own pyproject::

    [project.entry-points."fedtune.algorithms"]
    fedadam = "mypackage.fedadam:FedAdam"

``register`` adds a class at run time (a notebook, a test). This module imports nothing of fedtune,
so every layer may look algorithms up without an import cycle; loading one imports its module.
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any, TypeVar

GROUP = "fedtune.algorithms"
# The built-in methods, also reachable when fedtune runs from a source tree that was never installed.
BUILTIN = {
    "fedit": "fedtune.algorithms.fedit:FedIT",
    "fedpt": "fedtune.algorithms.fedpt:FedPT",
    "fedbiot": "fedtune.algorithms.fedbiot:FedBiOT",
    "fedavgm": "fedtune.algorithms.fedavgm:FedAvgM",
    "perfit": "fedtune.algorithms.perfit:PerFIT",
    "fedmkt": "fedtune.algorithms.fedmkt:FedMKT",
    "fedpft": "fedtune.algorithms.fedpft:FedPFT",
}

_registered: dict[str, type] = {}
_loaded: dict[str, type] = {}

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


def _targets() -> dict[str, str]:
    found = dict(BUILTIN)
    found.update({ep.name: ep.value for ep in entry_points(group=GROUP)})
    return found


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
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UnknownAlgorithm(f"unknown algorithm {name!r}{hint}; registered: {', '.join(names)}")
    module_name, _, attribute = targets[name].partition(":")
    cls = getattr(importlib.import_module(module_name), attribute)
    if getattr(cls, "name", None) != name:
        raise TypeError(
            f"entry point {name!r} of group {GROUP} names {targets[name]}, whose name is {cls.name!r}"
        )
    _loaded[name] = cls
    return cls
