"""Package attributes that load their module on first use (PEP 562).

An algorithm package re-exports its parts, but validating a config needs only its ``config`` module:
importing the package must not import the parts that load torch and transformers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is the attribute of the module
    ``modules[name]`` (e.g. ``"fedtune.algorithms.fedit.server"``), imported on first access."""

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(modules[name]), name)

    return __getattr__
