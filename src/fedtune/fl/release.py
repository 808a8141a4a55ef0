"""The release of a round's client updates: who takes part, how each update is bounded, and how the
updates become the next model, owned by one object built once from the config (``Release.from_config``).

A round is released in one of four ways: plainly (``fed.aggregator``: the weighted mean or a robust
rule), with client-level DP (``fl.privacy``: secret sampling, the server clips to C and adds noise,
the ledger accounts), with secure aggregation (``fl.secagg``: the clients clip and the server learns
only the masked sum), or both (the clients clip to C, the server noises the unmasked sum).

The two bounds an update meets, each resolved once here:

- ``update_clip_norm``: the L2 bound each update is scaled to (``fl.clipping.clip_l2``).
- ``quantisation_range``: the per-coordinate range secure aggregation quantises within.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedtune.errors import RunError
from fedtune.fl.aggregate import robust_aggregate
from fedtune.fl.federation import ClientTask, Federation
from fedtune.fl.privacy import ClientLevelDP
from fedtune.fl.secagg.client import client_tasks as secagg_client_tasks
from fedtune.fl.secagg.client import secure_update_task
from fedtune.fl.secagg.server import SecAggSettings, SecureAggregation

if TYPE_CHECKING:
    from fedtune.config import ExperimentConfig


# ----- the rules: each bound resolved once, from plain values ----------------------------------------
def update_clip_norm(dp_clip_norm: float | None, norm_bound: float | None) -> float | None:
    """C, the L2 bound on a client's whole update (``fl.clipping.clip_l2``), or None for no clipping.

    ``dp_clip_norm`` is ``dp.clip_norm`` when ``dp`` is on (``ClientLevelDP`` checked it), else None.
    Under ``dp``: that C, the sensitivity the accountant assumes (the server clips each update to it;
    under ``secagg`` each client does, before masking). Otherwise ``fed.norm_bound``: the norm above
    which the server rejects a plain reply; under ``secagg`` the server cannot see a reply's norm, so
    the client clips its update to that bound instead. Neither: the update is not clipped."""
    return dp_clip_norm if dp_clip_norm is not None else norm_bound


def quantisation_range(clip_range: float | None, dp_clip_norm: float | None) -> float:
    """R: secure aggregation clips every coordinate of an update to [-R, R] and quantises it there.

    ``secagg.clip_range`` when set; else under ``dp`` its C (an update of L2 norm <= C has every
    coordinate in [-C, C], so the range cuts nothing the DP clip kept); else 1.0."""
    if clip_range is not None:
        return float(clip_range)
    return dp_clip_norm if dp_clip_norm is not None else 1.0


def secagg_settings(cfg: ExperimentConfig, dp_clip_norm: float | None) -> SecAggSettings:
    """The protocol's parameters from ``secagg:``: quantised within ``quantisation_range``, weighted by
    example count unless ``dp`` (whose sum is unweighted), timed out as any client call."""
    section = cfg.secagg
    return SecAggSettings(
        threshold=section.threshold,
        bits=section.bits,
        clip_range=quantisation_range(section.clip_range, dp_clip_norm),
        neighbours=section.neighbours,
        weighted=not cfg.dp.enabled,
        timeout=cfg.fed.client_timeout,
        seed=cfg.seed,
    )


# ----- the clients' side, from the config alone ---------------------------------------------------
def client_task_table(
    cfg: ExperimentConfig, update_task: str, tasks: Mapping[str, ClientTask]
) -> dict[str, ClientTask]:
    """A method's ``tasks`` as its clients run them, built from the config alone (no DP mechanism, no
    server): what a SuperNode or a Ray actor serves. The bound is ``update_clip_norm`` of the same config."""
    dp_clip_norm = float(cfg.dp.clip_norm) if cfg.dp.enabled and cfg.dp.clip_norm is not None else None
    bound = update_clip_norm(dp_clip_norm, cfg.fed.norm_bound)
    return wrap_client_tasks(tasks, update_task, bound, secure=cfg.secagg.enabled)


def wrap_client_tasks(
    tasks: Mapping[str, ClientTask], update_task: str, clip_norm: float | None, *, secure: bool
) -> dict[str, ClientTask]:
    """Under secure aggregation the update task keeps its update (checked finite, clipped to
    ``clip_norm``) on the client and the protocol's four tasks join; otherwise ``tasks`` unchanged."""
    wrapped = dict(tasks)
    if secure:
        wrapped[update_task] = secure_update_task(wrapped[update_task], clip_norm)
        wrapped.update(secagg_client_tasks())
    return wrapped


# ----- the object ----------------------------------------------------------------------------------
@dataclass
class Release:
    """The run's release of client updates: sampling, clipping, secure aggregation and DP in one place.

    ``privacy`` (``dp.enabled``) samples each round's clients from the run's secret and noises and
    accounts each release; ``secure`` (``secagg.enabled``) keeps each update on its client and yields
    the round's masked sum. The runner checkpoints ``privacy`` and wraps the federation with ``secure``.
    """

    method: str
    """The algorithm's name, for the errors."""
    update_task: str
    """The client task whose reply's arrays are the update (what secure aggregation keeps on the client)."""
    clip_norm: float | None
    """``update_clip_norm``: what each client clips its update to under secure aggregation."""
    clients_per_round: int | None
    fraction: float
    aggregator: str
    trim: float
    privacy: ClientLevelDP | None = None
    secure: SecureAggregation | None = None

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, update_task: str) -> Release:
        """The run's release from its config (``dp:``, ``secagg:``, ``fed:``) and the method's update task."""
        fed = cfg.fed
        privacy = ClientLevelDP(cfg.dp, fed) if cfg.dp.enabled else None
        dp_clip_norm = privacy.clip_norm if privacy is not None else None
        settings = secagg_settings(cfg, dp_clip_norm)
        return cls(
            method=cfg.algorithm,
            update_task=update_task,
            clip_norm=update_clip_norm(dp_clip_norm, fed.norm_bound),
            clients_per_round=fed.clients_per_round,
            fraction=fed.fraction,
            aggregator=fed.aggregator,
            trim=fed.trim,
            privacy=privacy,
            secure=SecureAggregation(settings, update_task) if cfg.secagg.enabled else None,
        )

    # --- the clients' side ---
    def client_tasks(self, tasks: Mapping[str, ClientTask]) -> dict[str, ClientTask]:
        """``tasks`` as the clients run them (``client_task_table``, with this release's bound)."""
        return wrap_client_tasks(tasks, self.update_task, self.clip_norm, secure=self.secure is not None)

    # --- a round ---
    def sample(self, fed: Federation, rnd: int) -> list[str]:
        """Round ``rnd``'s clients: ``per_round`` seeded by the run's seed, or under ``dp`` drawn
        from the run's secret (Poisson with rate q, or ``fixed``) so that who took part stays hidden."""
        if self.privacy is not None:
            return self.privacy.sample(fed.client_ids(), rnd)
        return fed.sample(self.per_round(fed), rnd)

    def per_round(self, fed: Federation) -> int:
        """How many clients a round samples: ``fed.clients_per_round``, else ``fed.fraction`` of them (at
        least one), never more than there are."""
        total = len(fed.client_ids())
        count = self.clients_per_round or max(1, round(self.fraction * total))
        return min(count, total)

    def withheld(self) -> int:
        """Clients that replied but whose update secure aggregation left out of the round's sum (a lone
        client's): the round is not short of replies because of them."""
        return len(self.secure.withheld) if self.secure is not None else 0

    def aggregate(
        self,
        states: Sequence[Mapping[str, np.ndarray]],
        weights: Sequence[float],
        reference: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The round's new state: ``fed.aggregator`` over ``states``; under ``dp`` ``reference`` moved by
        the noised sum of the clipped updates over the expected count (accounted); under ``secagg``
        (``states`` empty) ``reference`` moved by the round's secure sum, weighted or noised."""
        if self.secure is not None:
            reference = self._required(reference, "secagg", "pass what the clients started from")
            return self._secure_step(self.secure, reference)
        if self.privacy is not None:
            reference = self._required(
                reference, "dp", "a method that sets dp_refused = None passes what it sent"
            )
            return self.privacy.aggregate(reference, states)
        return robust_aggregate(states, weights, self.aggregator, self.trim)

    def _secure_step(
        self, secure: SecureAggregation, reference: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """``reference`` moved by the round's secure sum: noised under ``dp``, else its weighted mean."""
        total, weight = secure.take(reference)
        if self.privacy is not None:
            return self.privacy.release_sum(reference, total)
        if weight <= 0:  # nobody's update is in the sum: the model stays
            return {key: np.array(value, copy=True) for key, value in reference.items()}
        return {
            key: (np.asarray(value, dtype=np.float64) + total[key] / weight).astype(value.dtype)
            for key, value in reference.items()
        }

    def _required(
        self, reference: Mapping[str, np.ndarray] | None, section: str, advice: str
    ) -> Mapping[str, np.ndarray]:
        if reference is None:
            raise RunError(
                f"{section}: algorithm {self.method!r} aggregated without the reference state; {advice} as "
                "Algorithm.aggregate(..., reference=)"
            )
        return reference
