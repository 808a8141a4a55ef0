"""Algorithm registry: ``@register`` a class, look it up by its ``name``."""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm

_REGISTRY: dict[str, type[Algorithm]] = {}
_BUILTIN_MODULES = ("fedtune.algorithms.fedavg", "fedtune.algorithms.fedpt", "fedtune.algorithms.fedbiot")

A = TypeVar("A", bound="type[Algorithm]")


def register(cls: A) -> A:
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def algorithm_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> type[Algorithm]:
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise KeyError(f"unknown algorithm {name!r}{hint}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
