"""Typed access to the algorithms ``fedtune.plugins`` discovers (entry-point group ``fedtune.algorithms``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtune.plugins import algorithm_class, algorithm_names, register

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm

__all__ = ["algorithm_names", "get_algorithm", "register"]


def get_algorithm(name: str) -> type[Algorithm]:
    cls: type[Algorithm] = algorithm_class(name)
    return cls
