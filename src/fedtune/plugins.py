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

``register`` adds a class at run time (a notebook, a test). This module imports nothing of fedtune but
``fedtune.suggest`` (which imports nothing of fedtune), so every layer may look algorithms up without an
import cycle; loading one imports its module.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, TypeVar

from fedtune.suggest import closest

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

CONFIG_GROUP = "fedtune.algorithm_configs"
BUILTIN_CONFIGS = {
    "fedit": "fedtune.algorithms.fedit.config:FedITConfig",
    "fedpt": "fedtune.algorithms.fedpt.config:FedPTConfig",
    "fedbiot": "fedtune.algorithms.fedbiot.config:FedBiOTConfig",
    "fedavgm": "fedtune.algorithms.fedavgm.config:FedAvgMConfig",
    "perfit": "fedtune.algorithms.perfit.config:PerFITConfig",
    "fedmkt": "fedtune.algorithms.fedmkt.config:FedMKTConfig",
    "fedpft": "fedtune.algorithms.fedpft.config:FedPFTConfig",
}

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
