"""Secure aggregation: SecAgg+ (Bell et al. 2020) as client tasks of fedtune's own protocol.

The server learns the sum of the round's client updates and nothing about any single one. After the
method's update task (``fit``), whose reply then carries only its statistics, four ``fed.call`` stages run
among the clients that replied (each message crosses the server, and is counted, like any other):

1. ``secagg_keys``: each client draws two key pairs (P-384): one to agree mask seeds with its neighbours,
   one to encrypt the shares it sends them, and advertises the public keys.
2. ``secagg_share``: the server sends each client its neighbours' public keys (the SecAgg+ graph: a ring
   over a shuffled order, ``k`` clients per neighbourhood). The client draws a self-mask seed ``b``,
   splits ``b`` and its mask private key into Shamir shares (threshold ``t``) and sends each neighbour
   its shares, encrypted for it (ECDH + HKDF + Fernet), through the server.
3. ``secagg_mask``: the server forwards each client the ciphertexts addressed to it. The client clips its
   update (L2 and per coordinate) and checks it is finite, quantises it to ``bits`` bits and uploads
   ``q + PRG(b) + sum_j +-PRG(s_ij) mod 2^32``: the pairwise masks cancel in the sum, the self mask
   hides the vector even if a neighbour's pairwise masks are later revealed.
4. ``secagg_unmask``: the server names the clients whose masked vectors arrived and those that dropped;
   each survivor returns its shares of the survivors' ``b`` and of the dropped clients' mask keys (never
   both for one client). With ``t`` shares the server removes the self masks and the dropped clients'
   pairwise masks, and dequantises the sum.

A client that drops after the key exchange is recovered as long as every mask it left can be rebuilt
(``t`` of its neighbours answer) and ``secagg.threshold`` of the round's clients uploaded; otherwise the
round fails with the reason. The primitives are maintained ones: elliptic-curve key agreement and the
PRG (AES-256 in counter mode) from ``cryptography``; Shamir sharing and the authenticated encryption of
shares from Flower (``flwr.common.secure_aggregation``). Flower's own mask generator is not used: it
folds its seed to 32 bits.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedtune.errors import RunError
from fedtune.fl.federation import SECRET, ClientContext, ClientTask, Federation, Traffic
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ArraySpec, Expect, ReplySpec

log = logging.getLogger("fedtune.secagg")

MODULUS_BITS = 32
"""Masked vectors live in Z_(2^32): uint32 arithmetic wraps exactly."""
STATE = f"{SECRET}secagg"
"""The client state entry the protocol keeps between its stages (cleared after unmasking). A round secret
(``federation.SECRET``): never checkpointed, forgotten when the next round begins, so a client that drops
mid-protocol leaves its keys and seed nowhere but its own memory."""
UPDATE = f"{SECRET}secagg_update"
"""The client state entry holding the update the update task left for the protocol (a round secret)."""
TASKS = ("secagg_keys", "secagg_share", "secagg_mask", "secagg_unmask")


class SecAggFailed(RunError):
    """Too few clients survived a stage for the masks to be removed; the message says which and why."""


# ----- primitives ------------------------------------------------------------------------------------
def _shamir() -> tuple[Callable[[bytes, int, int], list[bytes]], Callable[[list[bytes]], bytes]]:
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

    return create_shares, combine_shares


def _fernet() -> tuple[Callable[..., bytes], Callable[..., bytes], Callable[..., bytes]]:
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
        decrypt,
        encrypt,
        generate_shared_key,
    )

    return generate_shared_key, encrypt, decrypt


def new_key_pair() -> tuple[bytes, bytes]:
    """A P-384 key pair as ``(private PKCS8 DER, public SubjectPublicKeyInfo DER)``."""
    private = ec.generate_private_key(ec.SECP384R1())
    return (
        private.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def agreed_key(private_der: bytes, public_der: bytes) -> bytes:
    """The 32-byte key two parties agree on (ECDH, then HKDF-SHA256; urlsafe base64 as Fernet wants)."""
    generate_shared_key, _, _ = _fernet()
    private = serialization.load_der_private_key(private_der, password=None)
    public = serialization.load_der_public_key(public_der)
    if not isinstance(private, ec.EllipticCurvePrivateKey) or not isinstance(
        public, ec.EllipticCurvePublicKey
    ):
        raise ValueError("secure aggregation: not an elliptic-curve key")
    return bytes(generate_shared_key(private, public))


def prg(seed: bytes, size: int) -> np.ndarray:
    """``size`` pseudo-random uint32 words from a 32-byte seed: AES-256 in counter mode over zeros (each
    seed masks one vector of one round, so the fixed nonce is never reused with a key)."""
    import base64

    key = base64.urlsafe_b64decode(seed) if len(seed) == 44 else seed
    if len(key) != 32:
        raise ValueError(f"a mask seed has {len(key)} bytes, expected 32")
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(4 * size)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32)


def _frame(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (a share message's plaintext layout, not a cipher)."""
    return b"".join(len(part).to_bytes(4, "little") + part for part in parts)


def _unframe(data: bytes) -> list[bytes]:
    parts, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "little")
        parts.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return parts


def _bytes(value: object, what: str) -> bytes:
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8:
        raise ValueError(f"secure aggregation: {what} must be a uint8 array")
    return value.tobytes()


def _array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


# ----- quantisation ----------------------------------------------------------------------------------
def quantize(values: np.ndarray, clip_range: float, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Values clipped to [-R, R], mapped to {0, ..., 2^bits - 1} with unbiased stochastic rounding."""
    levels = (1 << bits) - 1
    scaled = (np.clip(values.astype(np.float64), -clip_range, clip_range) + clip_range) * (
        levels / (2 * clip_range)
    )
    low = np.floor(scaled)
    rounded = low + (rng.random(scaled.shape) < scaled - low)
    return np.clip(rounded, 0, levels).astype(np.uint32)


def dequantize_sum(total: np.ndarray, count: int, clip_range: float, bits: int) -> np.ndarray:
    """The sum of ``count`` dequantised vectors from the sum of their quantised ones (exact integers)."""
    levels = (1 << bits) - 1
    return total.astype(np.float64) * (2 * clip_range / levels) - count * clip_range


def quantization_step(clip_range: float, bits: int) -> float:
    return 2 * clip_range / ((1 << bits) - 1)


# ----- the client's side -----------------------------------------------------------------------------
def flat_update(reply: Payload, message: Payload) -> tuple[list[str], np.ndarray]:
    """The reply's arrays minus what the message sent under the same keys, flattened in key order."""
    keys = sorted(k for k, v in reply.items() if isinstance(v, np.ndarray))
    missing = [k for k in keys if not isinstance(message.get(k), np.ndarray)]
    if missing:
        raise ValueError(f"secure aggregation: the reply's '{missing[0]}' was not sent, so it has no update")
    parts = [
        (np.asarray(reply[k], dtype=np.float64) - np.asarray(message[k], dtype=np.float64)).ravel()
        for k in keys
    ]
    return keys, np.concatenate(parts) if parts else np.zeros(0)


def clip_l2(update: np.ndarray, bound: float | None) -> np.ndarray:
    """``update`` scaled to L2 norm <= ``bound`` (unchanged without one)."""
    if bound is None:
        return update
    norm = float(np.linalg.norm(update))
    return update * (bound / norm) if norm > bound else update


def secure_update_task(fit: ClientTask, clip_norm: float | None) -> ClientTask:
    """The method's update task under secure aggregation: it runs as usual, but its update (the reply's
    arrays minus what was sent) is checked finite, clipped to ``clip_norm`` and kept on the client for
    the protocol; the reply carries only the statistics (``num_examples``, ``train_loss``, ...)."""

    def task(ctx: ClientContext, msg: Payload) -> Payload:
        reply = fit(ctx, msg)
        keys, update = flat_update(reply, msg)
        if not np.all(np.isfinite(update)):
            raise ValueError("secure aggregation: the update holds NaN or Inf; it is not sent")
        count = reply.get("num_examples", 1)
        ctx.state[UPDATE] = {
            "round": int(ctx.rnd),
            "keys": keys,
            "update": clip_l2(update, clip_norm).astype(np.float32),
            "weight": int(count) if isinstance(count, int) else 1,
        }
        return {k: v for k, v in reply.items() if not isinstance(v, np.ndarray)}

    return task


def _names(text: object) -> list[str]:
    return [name for name in str(text).split(",") if name]


def client_keys(ctx: ClientContext, msg: Payload) -> Payload:
    """Stage 1: fresh key pairs for this round; the public halves go to the server."""
    held = ctx.state.get(UPDATE)
    if not isinstance(held, dict) or held.get("round") != int(msg["round"]):
        raise ValueError("secure aggregation: this client holds no update of this round")
    mask_private, mask_public = new_key_pair()
    share_private, share_public = new_key_pair()
    ctx.state[STATE] = {
        "round": int(msg["round"]),
        "mask_private": mask_private.hex(),
        "mask_public": mask_public.hex(),
        "share_private": share_private.hex(),
        "share_public": share_public.hex(),
    }
    return {"pk_mask": _array(mask_public), "pk_share": _array(share_public)}


def _own(ctx: ClientContext, msg: Payload) -> dict[str, Any]:
    own = ctx.state.get(STATE)
    if not isinstance(own, dict) or own.get("round") != int(msg["round"]):
        raise ValueError("secure aggregation: a stage arrived out of order (no keys of this round)")
    return own


def client_share(ctx: ClientContext, msg: Payload) -> Payload:
    """Stage 2: Shamir shares of the self-mask seed and of the mask key, one per neighbour, encrypted."""
    import os

    own = _own(ctx, msg)
    create_shares, _ = _shamir()
    _, encrypt, _ = _fernet()
    neighbours = _names(msg["neighbours"])
    threshold = int(msg["threshold"])
    me = ctx.client_id
    if me not in neighbours or len(neighbours) < threshold:
        raise ValueError(f"secure aggregation: {len(neighbours)} neighbours for threshold {threshold}")
    keys = {
        c: (_bytes(msg[f"pk_mask/{c}"], "a key"), _bytes(msg[f"pk_share/{c}"], "a key")) for c in neighbours
    }
    if keys[me] != (bytes.fromhex(own["mask_public"]), bytes.fromhex(own["share_public"])):
        raise ValueError("secure aggregation: the server relayed this client's own keys wrongly")
    every = [key for pair in keys.values() for key in pair]
    if len(set(every)) != len(every):
        raise ValueError("secure aggregation: two neighbours advertised the same key")
    seed = os.urandom(32)
    seed_shares = create_shares(seed, threshold, len(neighbours))
    key_shares = create_shares(bytes.fromhex(own["mask_private"]), threshold, len(neighbours))
    reply: Payload = {}
    held: dict[str, list[str]] = {}
    for index, other in enumerate(neighbours):
        if other == me:
            held[me] = [seed_shares[index].hex(), key_shares[index].hex()]
            continue
        box = agreed_key(bytes.fromhex(own["share_private"]), keys[other][1])
        plaintext = _frame(me.encode(), other.encode(), seed_shares[index], key_shares[index])
        reply[f"ct/{other}"] = _array(encrypt(box, plaintext))
    own.update(
        seed=seed.hex(),
        threshold=threshold,
        neighbours=neighbours,
        public={c: [pair[0].hex(), pair[1].hex()] for c, pair in keys.items()},
        held=held,
    )
    return reply


def client_mask(ctx: ClientContext, msg: Payload) -> Payload:
    """Stage 3: decrypt the neighbours' shares, then upload the quantised update under all masks."""
    own = _own(ctx, msg)
    _, _, decrypt = _fernet()
    me = ctx.client_id
    senders = []
    for key, value in msg.items():
        if not key.startswith("ct/"):
            continue
        sender = key[3:]
        if sender not in own["public"] or sender == me:
            raise ValueError(f"secure aggregation: a share from {sender}, not a neighbour")
        box = agreed_key(bytes.fromhex(own["share_private"]), bytes.fromhex(own["public"][sender][1]))
        source, target, seed_share, key_share = _unframe(decrypt(box, _bytes(value, "a ciphertext")))
        if source.decode() != sender or target.decode() != me:
            raise ValueError(f"secure aggregation: a share relayed from {sender} was meant for another pair")
        own["held"][sender] = [seed_share.hex(), key_share.hex()]
        senders.append(sender)
    if len(senders) + 1 < int(own["threshold"]):
        raise ValueError("secure aggregation: too few neighbours shared their keys")
    held = ctx.state[UPDATE]
    size = int(msg["size"])
    update = np.asarray(held["update"], dtype=np.float64)
    if update.size != size:
        raise ValueError(f"secure aggregation: the update has {update.size} values, the round {size}")
    scale = float(held["weight"]) / float(msg["weight_scale"]) if int(msg["weighted"]) else 1.0
    rng = np.random.default_rng([int(msg["rounding_seed"]), int(msg["round"]), zlib.crc32(me.encode())])
    quantised = quantize(update * scale, float(msg["clip_range"]), int(msg["bits"]), rng)
    masked = quantised + prg(bytes.fromhex(own["seed"]), size)
    mask_private = bytes.fromhex(own["mask_private"])
    for other in senders:
        pairwise = prg(agreed_key(mask_private, bytes.fromhex(own["public"][other][0])), size)
        masked = masked + pairwise if me > other else masked - pairwise
    own["masked_with"] = sorted(senders)
    return {"masked": masked.astype(np.uint32)}


def client_unmask(ctx: ClientContext, msg: Payload) -> Payload:
    """Stage 4: shares of the survivors' seeds and of the dropped clients' mask keys (never both)."""
    own = _own(ctx, msg)
    active, dropped = set(_names(msg["active"])), set(_names(msg["dropped"]))
    if active & dropped:
        raise ValueError("secure aggregation: the server named a client both active and dropped")
    if len(active) < int(own["threshold"]):
        raise ValueError("secure aggregation: fewer survivors than the threshold")
    reply: Payload = {}
    for owner, (seed_share, key_share) in own["held"].items():
        if owner in active:
            reply[f"seed/{owner}"] = _array(bytes.fromhex(seed_share))
        elif owner in dropped:
            reply[f"key/{owner}"] = _array(bytes.fromhex(key_share))
    ctx.state.pop(STATE, None)
    ctx.state.pop(UPDATE, None)
    return reply


def client_tasks() -> dict[str, ClientTask]:
    return dict(zip(TASKS, (client_keys, client_share, client_mask, client_unmask), strict=True))


# ----- the server's side -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SecAggSettings:
    """One round's protocol parameters (``secagg:`` plus what the run decides)."""

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
    _, combine_shares = _shamir()
    started = len(clients)
    needed = max(2, math.ceil(settings.threshold * started))
    _require(clients, started, needed, "the start (too few clients replied to the update task)", settings)
    rng = np.random.default_rng([settings.seed, rnd, 0x5EC])
    before_up, before_down = fed.traffic.bytes_up, fed.traffic.bytes_down
    start = time.perf_counter()

    opening: Payload = {"round": rnd}
    keys = _stage(fed, clients, "secagg_keys", opening, settings.timeout)
    advertised = [c for c in clients if c in keys and _valid_keys(keys[c], fed.traffic, c)]
    _require(advertised, started, needed, "the key advertisement", settings)
    width = neighbourhood_size(len(advertised), settings.neighbours)
    threshold = max(2, math.ceil(settings.threshold * width))
    graph = neighbourhoods(advertised, width, rng)

    def share_message(client: str) -> Payload:
        message: Payload = {"round": rnd, "threshold": threshold, "neighbours": ",".join(graph[client])}
        for other in graph[client]:
            message[f"pk_mask/{other}"] = keys[other]["pk_mask"]
            message[f"pk_share/{other}"] = keys[other]["pk_share"]
        return message

    shares = _stage(
        fed, advertised, "secagg_share", {c: share_message(c) for c in advertised}, settings.timeout
    )
    sharing = [c for c in advertised if c in shares]
    _require(sharing, started, needed, "the share exchange", settings)

    scale = max(weights[c] for c in sharing) if settings.weighted else 1
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
    survivors = [c for c in sharing if c in masked]
    dropped = [c for c in sharing if c not in masked]
    _require(survivors, started, needed, "the masked upload", settings)

    reveal: Payload = {"round": rnd, "active": ",".join(survivors), "dropped": ",".join(dropped)}
    answers = _stage(fed, survivors, "secagg_unmask", reveal, settings.timeout)
    total = np.zeros(size, dtype=np.uint32)
    for vector in masked.values():
        total += vector
    for owner in sharing:
        kind = "seed" if owner in masked else "key"
        collected = [
            _bytes(answer[f"{kind}/{owner}"], "a share")
            for helper, answer in answers.items()
            if helper in graph[owner] and isinstance(answer.get(f"{kind}/{owner}"), np.ndarray)
        ]
        if len(collected) < threshold:
            secret_name = "self-mask seed" if kind == "seed" else "mask key"
            raise SecAggFailed(
                f"secure aggregation failed at unmasking: {len(collected)} of {owner}'s neighbours returned "
                f"a share of its {secret_name}, {threshold} are needed "
                "(to change: secagg.threshold, secagg.neighbours, fed.client_timeout)"
            )
        secret = combine_shares(collected[:threshold])
        if kind == "seed":
            total -= prg(secret, size)
            continue
        for other in graph[owner]:  # the pairwise masks the survivors added for the dropped owner
            if other == owner or other not in masked:
                continue
            pairwise = prg(agreed_key(secret, _bytes(keys[other]["pk_mask"], "a key")), size)
            total = total - pairwise if other > owner else total + pairwise
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


def _is_bytes(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.uint8


def _valid_keys(reply: Payload, traffic: Traffic, client: str) -> bool:
    ok = all(_is_bytes(reply.get(key)) for key in ("pk_mask", "pk_share"))
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
