"""The ``dp:`` and ``secagg:`` sections: client-level differential privacy and secure aggregation, each off
by default and checked whole when on (what they refuse of the rest of the config: ``rules``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from fedtune.config.base import Section


def refuse_ignored_settings(section: BaseModel, name: str, consequence: str) -> None:
    """A section that is off (``enabled: false``) with keys set away from their defaults: those keys would
    be ignored, and whoever set them would believe they act. A ``ValueError`` naming them."""
    changed = [
        f"{name}.{key}"
        for key, field in type(section).model_fields.items()
        if key != "enabled" and getattr(section, key) != field.default
    ]
    if changed:
        raise ValueError(
            f"{', '.join(changed)} {'is' if len(changed) == 1 else 'are'} set but {name}.enabled is false: "
            f"{'it' if len(changed) == 1 else 'they'} would be ignored and {consequence}. Set "
            f"{name}.enabled: true, or remove {'it' if len(changed) == 1 else 'them'}"
        )


class DPConfig(Section):
    """Client-level differential privacy, central: the server clips each client's update, adds Gaussian
    noise to their sum and accounts for the privacy spent (docs/privacy.md)."""

    enabled: bool = False
    """Off by default. On: the methods that support it (``AlgorithmConfig.dp_refused`` is None) sample
    clients from a secret seed, clip, noise and account; the others refuse the run with the reason."""
    noise_multiplier: float | None = Field(None, gt=0)
    """z: the noise's standard deviation on the sum of clipped updates is z x clip_norm, per coordinate.
    Give it, or target_epsilon instead."""
    target_epsilon: float | None = Field(None, gt=0)
    """The epsilon to reach after fed.rounds rounds: the noise multiplier is calibrated from it (with the
    run's sampling rate and dp.delta) when the run starts."""
    clip_norm: float | None = Field(None, gt=0)
    """C: each client's update (its trained tensors minus what the server sent) is scaled to L2 norm <= C."""
    delta: float = Field(1e-5, gt=0, lt=1)
    """The delta of the (epsilon, delta) guarantee; keep it well below 1 / (number of clients)."""
    max_epsilon: float | None = Field(None, gt=0)
    """The run stops cleanly (final artifacts written) before a round that would take epsilon above it."""
    sampling: Literal["poisson", "fixed"] = "poisson"
    """poisson: each client joins a round with probability q (fed.clients_per_round / clients, else
    fed.fraction), independently, from a per-run secret; fixed: exactly fed.clients_per_round clients
    (replace-one neighbours: twice the sensitivity, so a larger epsilon for the same noise)."""
    accountant: Literal["pld", "rdp"] = "pld"
    """Which of dp-accounting's accountants gives epsilon (and calibrates target_epsilon): pld (privacy
    loss distributions: the tighter bound) or rdp (Renyi DP). Both are valid upper bounds. Fixed-size
    sampling is accounted with rdp (dp-accounting's PLD does not cover sampling without replacement)."""

    @model_validator(mode="after")
    def _complete(self) -> DPConfig:
        if not self.enabled:
            refuse_ignored_settings(self, "dp", "the run would not be private")
            return self
        if self.sampling == "fixed" and self.accountant == "pld" and "accountant" in self.model_fields_set:
            raise ValueError(
                "dp.accountant pld does not cover dp.sampling fixed (sampling without replacement): set "
                "dp.accountant: rdp, or dp.sampling: poisson"
            )
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "dp.enabled needs exactly one of dp.noise_multiplier (the noise) and dp.target_epsilon "
                "(the epsilon to calibrate the noise for)"
            )
        if self.clip_norm is None:
            raise ValueError(
                "dp.enabled needs dp.clip_norm, the L2 bound on each client's update (a non-DP run's "
                "update norms, e.g. fed.norm_bound's scale, tell what to expect)"
            )
        target, limit = self.target_epsilon, self.max_epsilon
        if target is not None and limit is not None and limit < target:
            raise ValueError(
                f"dp.max_epsilon {limit} is below dp.target_epsilon {target}: the run would stop before "
                "its last round; raise max_epsilon or lower target_epsilon"
            )
        return self


class SecAggConfig(Section):
    """Secure aggregation (SecAgg+, Bell et al. 2020): the server learns only the sum of the round's
    client updates (docs/privacy.md)."""

    enabled: bool = False
    """Off by default. On: the update task's reply carries only statistics; the update itself travels
    masked through four protocol stages and only the sum is unmasked."""
    threshold: float = Field(0.7, gt=0.5, le=1)
    """The share of a round's clients (those that replied to the update task) that must still be there
    at every stage; below it the round fails with the reason. Above 0.5, so the server can never
    collect enough shares to unmask both halves of one client."""
    neighbours: int | None = Field(None, ge=3)
    """k, the clients in each SecAgg+ neighbourhood (the client itself included, made odd): each client
    masks with, and secret-shares to, only these. null: 2 ceil(log2 n) + 1 of the round's n clients."""
    bits: int = Field(20, ge=8, le=30)
    """Bits per quantised value; the sum of a round's clients must fit the 32-bit modulus, so
    num_clients x 2^bits < 2^32."""
    clip_range: float | None = Field(None, gt=0)
    """R: every coordinate of an update is clipped to [-R, R] before quantisation (step 2R / (2^bits - 1)).
    null: dp.clip_norm under dp, else 1.0."""

    @model_validator(mode="after")
    def _used(self) -> SecAggConfig:
        if not self.enabled:
            refuse_ignored_settings(self, "secagg", "the server would see every update")
        return self
