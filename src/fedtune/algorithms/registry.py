"""Typed access to the algorithms ``fedtune.plugins`` discovers (entry-point group ``fedtune.algorithms``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtune.plugins import algorithm_class, algorithm_names, register

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fedtune.algorithms.base import Algorithm
    from fedtune.config import ExperimentConfig
    from fedtune.fl.federation import ClientTask

__all__ = ["algorithm_names", "client_tasks", "get_algorithm", "register"]


def get_algorithm(name: str) -> type[Algorithm]:
    cls: type[Algorithm] = algorithm_class(name)
    return cls


def client_tasks(cfg: ExperimentConfig) -> Mapping[str, ClientTask]:
    """The client task table of ``cfg``'s algorithm (``Algorithm.client_table``), built from the config
    alone without constructing the algorithm: what a process that serves clients runs (a SuperNode; a
    Ray actor, handed this function by reference so the federation layer imports no algorithm)."""
    return get_algorithm(cfg.algorithm).client_table(cfg)
