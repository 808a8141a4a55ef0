"""Secure aggregation, the server's side: the round's secure sum (``secure_sum``), the run's protocol
state (``SecureAggregation``) and the federation wrapper that runs it after the update task
(``SecureFederation``)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedtune.errors import RunError
from fedtune.fl.federation import Federation, Traffic
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.secagg.crypto import agreed_key, is_bytes, payload_bytes, prg, shamir
from fedtune.fl.secagg.quantisation import dequantize_sum
from fedtune.fl.validation import ArraySpec, Expect, ReplySpec


class SecAggFailed(RunError):
    """Too few clients survived a stage for the masks to be removed; the message says which and why."""


@dataclass(frozen=True)
class SecAggSettings:
    """One round's protocol parameters (``secagg:`` plus what the run decides, ``fl.release``)."""

    threshold: float
    bits: int
    clip_range: float
    neighbours: int | None = None
    weighted: bool = True
    timeout: float | None = None
    seed: int = 0


def neighbourhoods(clients: Sequence[str], size: int, rng: np.random.Generator) -> dict[str, list[str]]:
    """The SecAgg+ graph: clients on a ring in a random order, each with the ``size // 2`` on either side
    (itself included, ``size`` odd; everyone when ``size`` >= the number of clients). Symmetric."""
    order = [clients[i] for i in rng.permutation(len(clients))]
    count = len(order)
    if size >= count:
        return {c: sorted(order) for c in order}
    half = size // 2
    return {
        c: sorted({order[(i + offset) % count] for offset in range(-half, half + 1)})
        for i, c in enumerate(order)
    }


def neighbourhood_size(count: int, wanted: int | None) -> int:
    """``wanted`` (made odd), or SecAgg+'s 2 ceil(log2 n) + 1; never more than the ``count`` clients."""
    size = wanted if wanted is not None else 2 * math.ceil(math.log2(max(count, 2))) + 1
    size += 1 - size % 2
    return min(size, count)


@dataclass
class SecureSum:
    """What the server learns: the sum of the survivors' (weighted) updates, and how many took part."""

    total: np.ndarray
    survivors: list[str]
    weight: float
    """The sum of the survivors' weights (w_i / max w, or 1 each when unweighted)."""
    dropped: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Keyring:
    """A round's advertised public keys (client -> ``pk_mask``, ``pk_share``), its SecAgg+ graph and the
    number of shares that rebuild a secret within a neighbourhood."""

    keys: dict[str, Payload]
    graph: dict[str, list[str]]
    threshold: int


# ----- the round's secure sum, stage by stage ---------------------------------------------------------
def secure_sum(
    fed: Federation,
    clients: list[str],
    size: int,
    weights: Mapping[str, int],
    rnd: int,
    settings: SecAggSettings,
) -> SecureSum:
    """Run the four stages among ``clients`` (each holds an update of ``size`` values) and return the sum.

    Raises ``SecAggFailed`` when fewer than ``threshold`` of them are left at a stage or a mask cannot
    be rebuilt; the traffic records each client that dropped and why.
    """
    started = len(clients)
    needed = max(2, math.ceil(settings.threshold * started))

    def require(alive: Sequence[str], stage: str) -> None:
        _require(alive, started, needed, stage, settings)

    require(clients, "the start (too few clients replied to the update task)")
    before_up, before_down = fed.traffic.bytes_up, fed.traffic.bytes_down
    start = time.perf_counter()
    keys = advertise_keys(fed, clients, rnd, settings)
    require(list(keys), "the key advertisement")
    keyring = build_keyring(keys, rnd, settings)
    shares = exchange_shares(fed, keyring, rnd, settings)
    sharing = [c for c in keys if c in shares]
    require(sharing, "the share exchange")
    scale = max(weights[c] for c in sharing) if settings.weighted else 1
    masked = collect_masked(fed, sharing, shares, size, scale, rnd, settings)
    survivors = [c for c in sharing if c in masked]
    dropped = [c for c in sharing if c not in masked]
    require(survivors, "the masked upload")
    total = unmask_sum(fed, sharing, masked, keyring, size, rnd, settings)
    values = dequantize_sum(total, len(survivors), settings.clip_range, settings.bits)
    weight = float(sum(weights[c] / scale for c in survivors)) if settings.weighted else float(len(survivors))
    stats = {
        "secagg_clients": float(len(survivors)),
        "secagg_dropped": float(len(dropped)),
        "secagg_bytes_up": float(fed.traffic.bytes_up - before_up),
        "secagg_bytes_down": float(fed.traffic.bytes_down - before_down),
        # What the survivors' updates alone weigh (one uint32 per value, as large as float32 uploads):
        # the rest of the protocol's bytes are its overhead.
        "secagg_vector_bytes": float(4 * size * len(survivors)),
        "secagg_seconds": time.perf_counter() - start,
    }
    return SecureSum(values, survivors, weight, dropped, stats)


def advertise_keys(
    fed: Federation, clients: list[str], rnd: int, settings: SecAggSettings
) -> dict[str, Payload]:
    """Stage 1: every client's public keys, in ``clients``' order; a malformed reply is rejected."""
    opening: Payload = {"round": rnd}
    replies = _stage(fed, clients, "secagg_keys", opening, settings.timeout)
    return {c: replies[c] for c in clients if c in replies and _valid_keys(replies[c], fed.traffic, c)}


def build_keyring(keys: dict[str, Payload], rnd: int, settings: SecAggSettings) -> Keyring:
    """The round's SecAgg+ graph over the clients that advertised keys (seeded by the run and round)."""
    width = neighbourhood_size(len(keys), settings.neighbours)
    threshold = max(2, math.ceil(settings.threshold * width))
    graph = neighbourhoods(list(keys), width, np.random.default_rng([settings.seed, rnd, 0x5EC]))
    return Keyring(keys, graph, threshold)


def exchange_shares(
    fed: Federation, keyring: Keyring, rnd: int, settings: SecAggSettings
) -> dict[str, Payload]:
    """Stage 2: each client gets its neighbours' public keys and replies with its encrypted shares."""

    def share_message(client: str) -> Payload:
        neighbours = keyring.graph[client]
        message: Payload = {"round": rnd, "threshold": keyring.threshold, "neighbours": ",".join(neighbours)}
        for other in neighbours:
            message[f"pk_mask/{other}"] = keyring.keys[other]["pk_mask"]
            message[f"pk_share/{other}"] = keyring.keys[other]["pk_share"]
        return message

    clients = list(keyring.keys)
    return _stage(fed, clients, "secagg_share", {c: share_message(c) for c in clients}, settings.timeout)


def collect_masked(
    fed: Federation,
    sharing: list[str],
    shares: Mapping[str, Payload],
    size: int,
    scale: int,
    rnd: int,
    settings: SecAggSettings,
) -> dict[str, np.ndarray]:
    """Stage 3: each client gets the ciphertexts addressed to it and uploads its masked vector; those
    that are not ``size`` uint32 values are rejected."""
    common: Payload = {
        "round": rnd,
        "size": size,
        "bits": settings.bits,
        "clip_range": settings.clip_range,
        "weighted": int(settings.weighted),
        "weight_scale": int(scale),
        "rounding_seed": settings.seed,
    }
    inbox: dict[str, Payload] = {}
    for client in sharing:
        inbox[client] = dict(common)
        for sender in sharing:
            ciphertext = shares[sender].get(f"ct/{client}")
            if sender != client and isinstance(ciphertext, np.ndarray):
                inbox[client][f"ct/{sender}"] = ciphertext
    uploads = _stage(fed, sharing, "secagg_mask", inbox, settings.timeout)
    masked: dict[str, np.ndarray] = {}
    for client in sharing:
        vector = uploads.get(client, {}).get("masked")
        if isinstance(vector, np.ndarray) and vector.dtype == np.uint32 and vector.shape == (size,):
            masked[client] = vector
        elif client in uploads:
            fed.traffic.rejected[client] = (
                f"secure aggregation: a masked vector that is not {size} uint32 values"
            )
    return masked


def unmask_sum(
    fed: Federation,
    sharing: list[str],
    masked: Mapping[str, np.ndarray],
    keyring: Keyring,
    size: int,
    rnd: int,
    settings: SecAggSettings,
) -> np.ndarray:
    """Stage 4: the survivors return their shares; the masked vectors' sum with every self mask and every
    pairwise mask a dropped client left removed (the quantised sum, uint32)."""
    survivors = [c for c in sharing if c in masked]
    dropped = [c for c in sharing if c not in masked]
    reveal: Payload = {"round": rnd, "active": ",".join(survivors), "dropped": ",".join(dropped)}
    answers = _stage(fed, survivors, "secagg_unmask", reveal, settings.timeout)
    total = np.zeros(size, dtype=np.uint32)
    for vector in masked.values():
        total += vector
    for owner in sharing:
        if owner in masked:
            total -= prg(rebuilt_secret(owner, "seed", answers, keyring), size)
            continue
        mask_key = rebuilt_secret(owner, "key", answers, keyring)
        for other in keyring.graph[owner]:  # the pairwise masks the survivors added for the dropped owner
            if other == owner or other not in masked:
                continue
            pairwise = prg(agreed_key(mask_key, payload_bytes(keyring.keys[other]["pk_mask"], "a key")), size)
            total = total - pairwise if other > owner else total + pairwise
    return total


def rebuilt_secret(owner: str, kind: str, answers: Mapping[str, Payload], keyring: Keyring) -> bytes:
    """``owner``'s self-mask seed (``kind`` seed) or mask key (``key``) from its neighbours' shares."""
    _, combine_shares = shamir()
    collected = [
        payload_bytes(answer[f"{kind}/{owner}"], "a share")
        for helper, answer in answers.items()
        if helper in keyring.graph[owner] and isinstance(answer.get(f"{kind}/{owner}"), np.ndarray)
    ]
    if len(collected) < keyring.threshold:
        secret_name = "self-mask seed" if kind == "seed" else "mask key"
        raise SecAggFailed(
            f"secure aggregation failed at unmasking: {len(collected)} of {owner}'s neighbours returned "
            f"a share of its {secret_name}, {keyring.threshold} are needed "
            "(to change: secagg.threshold, secagg.neighbours, fed.client_timeout)"
        )
    return combine_shares(collected[: keyring.threshold])


def _stage(
    fed: Federation,
    clients: list[str],
    task: str,
    payload: Payload | Mapping[str, Payload],
    timeout: float | None,
) -> dict[str, Payload]:
    return fed.call(clients, task, payload, timeout=timeout) if clients else {}


def _require(alive: Sequence[str], started: int, needed: int, stage: str, settings: SecAggSettings) -> None:
    if len(alive) < needed:
        raise SecAggFailed(
            f"secure aggregation failed at {stage}: {len(alive)} of the round's {started} clients are left, "
            f"secagg.threshold {settings.threshold:g} needs {needed}; the round's masked updates cannot be "
            "unmasked (to change: secagg.threshold, fed.client_timeout)"
        )


def _valid_keys(reply: Payload, traffic: Traffic, client: str) -> bool:
    ok = all(is_bytes(reply.get(key)) for key in ("pk_mask", "pk_share"))
    if not ok:
        traffic.rejected[client] = "secure aggregation: public keys are not uint8 arrays"
    return ok


# ----- the run's secure aggregation ------------------------------------------------------------------
def scalar_spec(expect: Expect) -> tuple[Expect, dict[str, ArraySpec]]:
    """``expect`` without its arrays (they stay on the clients) and the arrays' layout it described."""
    if isinstance(expect, ReplySpec):
        return _scalars_only(expect), dict(expect.arrays)
    layouts = {c: dict(spec.arrays) for c, spec in expect.items()}
    first = next(iter(layouts.values()), {})
    if any(layout != first for layout in layouts.values()):
        raise SecAggFailed("secure aggregation needs every client's update laid out alike")
    return {c: _scalars_only(spec) for c, spec in expect.items()}, first


def _scalars_only(spec: ReplySpec) -> ReplySpec:
    return ReplySpec({}, spec.scalars, None, None, False, spec.example_limits)


class SecureAggregation:
    """The run's secure aggregation: the federation wrapper runs ``secure_sum`` after the update task,
    ``Algorithm.aggregate`` takes its result; the rows get its cost."""

    def __init__(self, settings: SecAggSettings, update_task: str) -> None:
        self.settings = settings
        self.update_task = update_task
        self.pending: tuple[SecureSum, list[str]] | None = None
        self.stats: dict[str, float] = {}
        self.withheld: set[str] = set()
        """Clients whose reply was fine but whose update the protocol left out of this round's sum (the
        only one that replied): the round is not short of replies because of them."""

    def after_update(
        self, fed: Federation, replies: dict[str, Payload], layout: Mapping[str, ArraySpec], rnd: int
    ) -> dict[str, Payload]:
        """Run the protocol among the clients that replied; return the replies of those whose update is in
        the sum (the others are recorded in the traffic)."""
        keys = sorted(layout)
        size = int(sum(int(np.prod(layout[k].shape)) for k in keys))
        self.withheld = set()
        if not replies:
            self.pending = (SecureSum(np.zeros(size), [], 0.0), keys)
            return replies
        if len(replies) == 1:
            only = next(iter(replies))
            fed.traffic.failed[only] = (
                "secure aggregation: the only client that replied would have its update revealed; left out"
            )
            self.withheld = {only}
            self.pending = (SecureSum(np.zeros(size), [], 0.0), keys)
            return {}
        weights = {c: _weight(r) for c, r in replies.items()}
        result = secure_sum(fed, list(replies), size, weights, rnd, self.settings)
        for client in replies:
            if client not in result.survivors and client not in fed.traffic.rejected:
                fed.traffic.failed.setdefault(client, "secure aggregation: dropped before its masked upload")
        self.pending = (result, keys)
        self.stats = result.stats
        return {c: replies[c] for c in result.survivors}

    def take(self, reference: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """The pending sum keyed like ``reference`` (float64) and its total weight; consumed once."""
        if self.pending is None:
            raise RunError("secure aggregation: Algorithm.aggregate found no secure sum of this round")
        result, keys = self.pending
        self.pending = None
        names = _match(keys, list(reference))
        out: dict[str, np.ndarray] = {}
        at = 0
        for key in keys:
            name = names[key]
            shape = np.shape(reference[name])
            count = int(np.prod(shape))
            out[name] = result.total[at : at + count].reshape(shape) if result.total.size else np.zeros(shape)
            at += count
        return out, result.weight

    def row(self) -> dict[str, float]:
        row = {k: round(v, 4) for k, v in self.stats.items()}
        self.stats = {}
        return row


def _weight(reply: Payload) -> int:
    count = reply.get("num_examples", 1)
    return int(count) if isinstance(count, int) else 1


def _match(keys: Sequence[str], reference: Sequence[str]) -> dict[str, str]:
    """Each wire key (``adapter/x``) to its reference key (``x``): the wire keys share one prefix, so both
    sorted lists pair up; anything else is an error."""
    if len(keys) != len(reference):
        raise RunError(f"secure aggregation: {len(keys)} updated arrays for a reference of {len(reference)}")
    out = dict(zip(sorted(keys), sorted(reference), strict=True))
    prefixes = {key[: len(key) - len(name)] for key, name in out.items()}
    if len(prefixes) != 1 or any(not key.endswith(name) for key, name in out.items()):
        raise RunError("secure aggregation: the update's arrays do not match the aggregated state's keys")
    return out


class SecureFederation:
    """A backend with secure aggregation: the update task's replies lose their arrays (the clients keep
    them) and the protocol runs right after it; everything else passes through."""

    def __init__(self, inner: Any, secure: SecureAggregation) -> None:
        self.inner = inner
        self.secure = secure

    @property
    def traffic(self) -> Traffic:
        traffic: Traffic = self.inner.traffic
        return traffic

    @traffic.setter
    def traffic(self, value: Traffic) -> None:
        self.inner.traffic = value

    @property
    def client_sizes(self) -> Mapping[str, int]:
        sizes: Mapping[str, int] = self.inner.client_sizes
        return sizes

    @property
    def rnd(self) -> int:
        return int(self.inner.rnd)

    @rnd.setter
    def rnd(self, value: int) -> None:
        self.inner.rnd = value

    def client_ids(self) -> list[str]:
        ids: list[str] = self.inner.client_ids()
        return ids

    def sample(self, k: int, rnd: int) -> list[str]:
        chosen: list[str] = self.inner.sample(k, rnd)
        return chosen

    def begin_round(self, rnd: int) -> None:
        self.inner.begin_round(rnd)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self.inner.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def call(
        self,
        clients: list[str],
        task: str,
        payload: Payload | Mapping[str, Payload],
        timeout: float | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Payload]:
        if task != self.secure.update_task:
            replies: dict[str, Payload] = self.inner.call(
                clients, task, payload, timeout=timeout, expect=expect
            )
            return replies
        if expect is None:
            raise RunError("secure aggregation: the update task's call names no reply spec (the layout)")
        scalars, layout = scalar_spec(expect)
        replies = self.inner.call(clients, task, payload, timeout=timeout, expect=scalars)
        for client, reply in replies.items():
            if arrays(reply):
                raise RunError(f"secure aggregation: client {client}'s update reply carries arrays")
        return self.secure.after_update(self, replies, layout, self.rnd)
