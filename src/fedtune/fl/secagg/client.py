"""Secure aggregation, the client's side: the update task's wrap and the protocol's four client tasks.

What a client holds between the stages (its keys, its self-mask seed, the shares it received and its
clipped update) lives in round secrets of its own state (``federation.SECRET``), cleared after unmasking.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

from fedtune.fl.clipping import clip_l2, update_delta
from fedtune.fl.federation import SECRET, ClientContext, ClientTask
from fedtune.fl.payload import Payload
from fedtune.fl.secagg.crypto import (
    agreed_key,
    bytes_array,
    frame,
    new_key_pair,
    payload_bytes,
    prg,
    shamir,
    share_cipher,
    unframe,
)
from fedtune.fl.secagg.quantisation import quantize

STATE = f"{SECRET}secagg"
"""The client state entry the protocol keeps between its stages (cleared after unmasking). A round secret
(``federation.SECRET``): never checkpointed, forgotten when the next round begins, so a client that drops
mid-protocol leaves its keys and seed nowhere but its own memory."""
UPDATE = f"{SECRET}secagg_update"
"""The client state entry holding the update the update task left for the protocol (a round secret)."""
TASKS = ("secagg_keys", "secagg_share", "secagg_mask", "secagg_unmask")


def update_of(reply: Payload, message: Payload) -> dict[str, np.ndarray]:
    """The reply's arrays minus what the message sent under the same keys (float64), in key order."""
    returned = {k: v for k, v in sorted(reply.items()) if isinstance(v, np.ndarray)}
    sent = {k: v for k, v in message.items() if k in returned and isinstance(v, np.ndarray)}
    missing = [k for k in returned if k not in sent]
    if missing:
        raise ValueError(f"secure aggregation: the reply's '{missing[0]}' was not sent, so it has no update")
    return update_delta(returned, {k: sent[k] for k in returned})


def secure_update_task(fit: ClientTask, clip_norm: float | None) -> ClientTask:
    """The method's update task under secure aggregation: it runs as usual, but its update (the reply's
    arrays minus what was sent) is checked finite, clipped to ``clip_norm`` and kept on the client for
    the protocol; the reply carries only the statistics (``num_examples``, ``train_loss``, ...)."""

    def task(ctx: ClientContext, msg: Payload) -> Payload:
        reply = fit(ctx, msg)
        update = update_of(reply, msg)
        if not all(np.all(np.isfinite(values)) for values in update.values()):
            raise ValueError("secure aggregation: the update holds NaN or Inf; it is not sent")
        clipped, _ = clip_l2(update, clip_norm)
        flat = np.concatenate([values.ravel() for values in clipped.values()]) if clipped else np.zeros(0)
        count = reply.get("num_examples", 1)
        ctx.state[UPDATE] = {
            "round": int(ctx.rnd),
            "keys": list(clipped),
            "update": flat.astype(np.float32),
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
    return {"pk_mask": bytes_array(mask_public), "pk_share": bytes_array(share_public)}


def _own(ctx: ClientContext, msg: Payload) -> dict[str, Any]:
    own = ctx.state.get(STATE)
    if not isinstance(own, dict) or own.get("round") != int(msg["round"]):
        raise ValueError("secure aggregation: a stage arrived out of order (no keys of this round)")
    return own


def client_share(ctx: ClientContext, msg: Payload) -> Payload:
    """Stage 2: Shamir shares of the self-mask seed and of the mask key, one per neighbour, encrypted."""
    own = _own(ctx, msg)
    create_shares, _ = shamir()
    _, encrypt, _ = share_cipher()
    neighbours = _names(msg["neighbours"])
    threshold = int(msg["threshold"])
    me = ctx.client_id
    if me not in neighbours or len(neighbours) < threshold:
        raise ValueError(f"secure aggregation: {len(neighbours)} neighbours for threshold {threshold}")
    keys = {
        c: (payload_bytes(msg[f"pk_mask/{c}"], "a key"), payload_bytes(msg[f"pk_share/{c}"], "a key"))
        for c in neighbours
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
        plaintext = frame(me.encode(), other.encode(), seed_shares[index], key_shares[index])
        reply[f"ct/{other}"] = bytes_array(encrypt(box, plaintext))
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
    senders = _receive_shares(own, ctx.client_id, msg)
    if len(senders) + 1 < int(own["threshold"]):
        raise ValueError("secure aggregation: too few neighbours shared their keys")
    size = int(msg["size"])
    masked = _quantised_update(ctx, msg, size) + prg(bytes.fromhex(own["seed"]), size)
    mask_private = bytes.fromhex(own["mask_private"])
    for other in senders:
        pairwise = prg(agreed_key(mask_private, bytes.fromhex(own["public"][other][0])), size)
        masked = masked + pairwise if ctx.client_id > other else masked - pairwise
    own["masked_with"] = sorted(senders)
    return {"masked": masked.astype(np.uint32)}


def _receive_shares(own: dict[str, Any], me: str, msg: Payload) -> list[str]:
    """Decrypt the shares the message relays (``ct/<sender>``) into ``own["held"]``; their senders."""
    _, _, decrypt = share_cipher()
    senders = []
    for key, value in msg.items():
        if not key.startswith("ct/"):
            continue
        sender = key[3:]
        if sender not in own["public"] or sender == me:
            raise ValueError(f"secure aggregation: a share from {sender}, not a neighbour")
        box = agreed_key(bytes.fromhex(own["share_private"]), bytes.fromhex(own["public"][sender][1]))
        source, target, seed_share, key_share = unframe(decrypt(box, payload_bytes(value, "a ciphertext")))
        if source.decode() != sender or target.decode() != me:
            raise ValueError(f"secure aggregation: a share relayed from {sender} was meant for another pair")
        own["held"][sender] = [seed_share.hex(), key_share.hex()]
        senders.append(sender)
    return senders


def _quantised_update(ctx: ClientContext, msg: Payload, size: int) -> np.ndarray:
    """The held update, weighted as the round says, quantised within the round's clip range."""
    held = ctx.state[UPDATE]
    update = np.asarray(held["update"], dtype=np.float64)
    if update.size != size:
        raise ValueError(f"secure aggregation: the update has {update.size} values, the round {size}")
    scale = float(held["weight"]) / float(msg["weight_scale"]) if int(msg["weighted"]) else 1.0
    rng = np.random.default_rng(
        [int(msg["rounding_seed"]), int(msg["round"]), zlib.crc32(ctx.client_id.encode())]
    )
    return quantize(update * scale, float(msg["clip_range"]), int(msg["bits"]), rng)


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
            reply[f"seed/{owner}"] = bytes_array(bytes.fromhex(seed_share))
        elif owner in dropped:
            reply[f"key/{owner}"] = bytes_array(bytes.fromhex(key_share))
    ctx.state.pop(STATE, None)
    ctx.state.pop(UPDATE, None)
    return reply


def client_tasks() -> dict[str, ClientTask]:
    """The protocol's four client tasks by name."""
    return dict(zip(TASKS, (client_keys, client_share, client_mask, client_unmask), strict=True))
