"""The base of every method's own config section (``fedit:``, ``fedpt:`` ...): what the method declares
about the runs it supports, read by the cross-section rules before anything runs."""

from __future__ import annotations

from typing import ClassVar

from fedtune.config.base import Section


class AlgorithmConfig(Section):
    """Base of an algorithm's own config section (``cfg.<algorithm name>``), defined in its module."""

    modes: ClassVar[tuple[str, ...]] = ("federated",)
    """The ``fed.mode`` values the algorithm implements; any other is a config error before training."""
    personal_eval: ClassVar[bool] = False
    """Whether the algorithm has the client-side evaluation task (``eval.personal``)."""
    requires_personal_eval: ClassVar[bool] = False
    """A method whose models are all personal (no global model): ``eval.personal`` must be on."""
    dp_refused: ClassVar[str | None] = (
        "it does not declare client-level DP support (a method whose server moves its model only by "
        "Algorithm.aggregate of client tensors with the reference state sets dp_refused = None)"
    )
    """Why the method cannot run under ``dp`` (client-level differential privacy); None: its clients are
    sampled by ``Algorithm.sample_clients`` and every client-dependent change of the released model goes
    through ``Algorithm.aggregate(states, weights, reference)``, which clips, noises and accounts."""

    def dp_problem(self) -> str | None:
        """Why the method, so configured, cannot run under ``dp`` (default: ``dp_refused``)."""
        return self.dp_refused

    quantization_refused: ClassVar[str | None] = None
    """Why the method cannot train on a quantised base (``model.quantization``), e.g. because its
    clients' models are built from weights sent over the wire; None: the method loads its LoRA bases
    through ``Resources.model`` and ``model.quantization`` applies to them."""
