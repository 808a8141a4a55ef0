"""Reply validation: every client reply is checked before it may be aggregated."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedtune.fl.clipping import update_norm
from fedtune.fl.payload import REPLY_TO, Payload, PayloadError, check_payload

log = logging.getLogger("fedtune.fl")


class ReplyRejected(ValueError):
    """A client reply failed validation; the message is the reason that gets logged."""


@dataclass(frozen=True)
class ArraySpec:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ReplySpec:
    """What a valid reply looks like.

    ``arrays`` must all be present with these shapes and dtypes (no extra arrays allowed),
    ``scalars`` maps required scalar keys to their types, ``norm_bound`` bounds the L2 norm
    of ``array - reference`` over all arrays (the update size) when a reference is given.
    A ``num_examples`` scalar is an aggregation weight: it must be positive and, for a client in
    ``example_limits`` (what the server knows of its data), no larger than that.
    """

    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    scalars: Mapping[str, type] = field(default_factory=dict)
    norm_bound: float | None = None
    reference: Mapping[str, np.ndarray] | None = None
    allow_extra: bool = False
    example_limits: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def like(
        cls,
        template: Mapping[str, np.ndarray],
        scalars: Mapping[str, type] | None = None,
        norm_bound: float | None = None,
        reference: bool = True,
        example_limits: Mapping[str, int] | None = None,
    ) -> ReplySpec:
        """A spec for replies shaped like ``template`` (e.g. the state the server sent)."""
        specs = {key: ArraySpec(tuple(value.shape), str(value.dtype)) for key, value in template.items()}
        reference_arrays = dict(template) if reference else None
        return cls(
            specs, dict(scalars or {}), norm_bound, reference_arrays, False, dict(example_limits or {})
        )


SCALAR_RANGES: Mapping[str, tuple[float, float]] = {
    "train_loss": (0.0, float("inf")),
    "tokens": (0, float("inf")),
    "trained_examples": (0, float("inf")),
    "num_eval_examples": (1, float("inf")),
}
"""What a reported statistic can be, by name: a loss is never negative, a count never below zero."""


def _check_scalar(reply: Payload, key: str, kind: type) -> None:
    if key not in reply:
        raise ReplyRejected(f"missing scalar '{key}'")
    value = reply[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ReplyRejected(f"scalar '{key}' must be {kind.__name__}, got {type(value).__name__}")
    if isinstance(value, float) and not np.isfinite(value):
        raise ReplyRejected(f"scalar '{key}' is not finite ({value})")
    low, high = SCALAR_RANGES.get(key, (-np.inf, np.inf))
    if isinstance(value, int | float) and not low <= value <= high:
        raise ReplyRejected(f"scalar '{key}' = {value!r} is outside what it can be ([{low}, {high}])")


def _check_array(key: str, value: object, spec: ArraySpec) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ReplyRejected(f"'{key}' must be an array, got {type(value).__name__}")
    if tuple(value.shape) != spec.shape:
        raise ReplyRejected(f"'{key}' has shape {tuple(value.shape)}, expected {spec.shape}")
    if str(value.dtype) != spec.dtype:
        raise ReplyRejected(f"'{key}' has dtype {value.dtype}, expected {spec.dtype}")
    if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
        raise ReplyRejected(f"'{key}' contains NaN or Inf")
    return value


def reply_update_norm(reply: Payload, spec: ReplySpec) -> float | None:
    """The L2 norm (``fl.clipping.update_norm``) of ``reply``'s arrays minus ``spec.reference``, over the
    spec's arrays the reference and the reply both hold (None: the spec has no reference)."""
    if spec.reference is None:
        return None
    returned: dict[str, np.ndarray] = {}
    sent: dict[str, np.ndarray] = {}
    for key in spec.arrays:
        value = reply.get(key)
        if key in spec.reference and isinstance(value, np.ndarray):
            returned[key], sent[key] = value, spec.reference[key]
    return update_norm(returned, sent)


def screen_replies(
    replies: Mapping[str, Payload], expect: Expect | None, factor: float | None
) -> dict[str, str]:
    """The replies to reject as outliers: update norm above ``factor`` x the median update norm of the
    call (``fed.screen``), among 3 or more replies whose spec has a reference; client -> reason."""
    if expect is None or factor is None:
        return {}
    norms = {c: n for c, r in replies.items() if (n := reply_update_norm(r, spec_for(expect, c))) is not None}
    if len(norms) < 3:
        return {}
    median = float(np.median(list(norms.values())))
    limit = factor * median
    return {
        c: f"update norm {n:.4g} exceeds {factor:g} x the round's median update norm {median:.4g} "
        "(fed.screen)"
        for c, n in norms.items()
        if n > limit and n > 0
    }


def drop_outliers(
    replies: Mapping[str, Payload],
    expect: Expect | None,
    factor: float | None,
    rejected: dict[str, str],
    rnd: int,
) -> dict[str, Payload]:
    """``replies`` without ``screen_replies``' outliers, each recorded in ``rejected`` with its reason."""
    outliers = screen_replies(replies, expect, factor)
    for client, reason in outliers.items():
        rejected[client] = reason
        log.warning("round %d: rejected the reply of client %s: %s", rnd, client, reason)
    return {client: reply for client, reply in replies.items() if client not in outliers}


def _check_weight(payload: Payload, spec: ReplySpec, client: str | None) -> None:
    count = payload["num_examples"]
    if not isinstance(count, int) or count <= 0:
        raise ReplyRejected(f"num_examples must be a positive count, got {count!r}")
    limit = spec.example_limits.get(client) if client is not None else None
    if limit is not None and count > limit:
        raise ReplyRejected(f"num_examples {count} exceeds the {limit} examples client {client} holds")


Expect = ReplySpec | Mapping[str, ReplySpec]
"""What a call expects back: one spec for every client, or a spec per client (clients whose models or
masks differ send different keys and shapes)."""


def spec_for(expect: Expect, client: str) -> ReplySpec:
    """``client``'s reply spec; a per-client mapping without the client rejects its reply."""
    if isinstance(expect, ReplySpec):
        return expect
    spec = expect.get(client)
    if spec is None:
        raise ReplyRejected(f"no reply spec for client {client} (the server expected no reply from it)")
    return spec


def addressed(message: Payload, task: str, rnd: int) -> tuple[Payload, str]:
    """``message`` with its reply tag (``payload.REPLY_TO``), and the tag its reply must carry."""
    tag = f"{task}@{rnd}#{secrets.token_hex(4)}"
    return {**message, REPLY_TO: tag}, tag


def _what(tag: str) -> str:
    task, _, rest = tag.partition("@")
    return f"{task} of round {rest.partition('#')[0]}"


def check_answers(reply: Payload, tag: str, rnd: int) -> Payload:
    """``reply`` without its tag, if it answers the message tagged ``tag`` of round ``rnd``: a stale or
    replayed reply (an earlier round's, another task's, another call's) is ``ReplyRejected``, and so is
    a reply whose own ``round`` entry names another round."""
    answered = reply.get(REPLY_TO)
    if not isinstance(answered, str):
        raise ReplyRejected(f"the reply does not say which message it answers (no '{REPLY_TO}')")
    if answered != tag:
        same = _what(answered) == _what(tag)
        raise ReplyRejected(
            f"the reply answers {'an earlier call of ' if same else ''}{_what(answered)}, not this call's "
            f"{_what(tag)}: a stale or replayed reply"
        )
    claimed = reply.get("round")
    if claimed is not None and claimed != rnd:
        raise ReplyRejected(f"the reply says it is of round {claimed!r}, and this is round {rnd}")
    return {key: value for key, value in reply.items() if key != REPLY_TO}


def check_reply(reply: Payload, expect: Expect | None, client: str) -> Payload:
    """``reply`` checked against ``client``'s spec in ``expect`` (unchecked when ``expect`` is None)."""
    return reply if expect is None else validate_reply(reply, spec_for(expect, client), client)


def validate_reply(reply: object, spec: ReplySpec, client: str | None = None) -> Payload:
    """Return ``client``'s reply if it satisfies ``spec``; raise ReplyRejected naming the first problem."""
    try:
        payload = check_payload(reply, "reply")
    except PayloadError as exc:
        raise ReplyRejected(str(exc)) from None
    for key, kind in spec.scalars.items():
        _check_scalar(payload, key, kind)
    # Every number a client reports, declared or not (e.g. its evaluation metrics), must be finite.
    for key, value in payload.items():
        if isinstance(value, float) and not np.isfinite(value):
            raise ReplyRejected(f"scalar '{key}' is not finite ({value})")
    if "num_examples" in spec.scalars:
        _check_weight(payload, spec, client)
    missing = sorted(set(spec.arrays) - set(payload))
    if missing:
        raise ReplyRejected(f"missing arrays: {', '.join(missing[:5])}")
    if not spec.allow_extra:
        extra = sorted(k for k, v in payload.items() if isinstance(v, np.ndarray) and k not in spec.arrays)
        if extra:
            raise ReplyRejected(f"unexpected arrays: {', '.join(extra[:5])}")
    for key, array_spec in spec.arrays.items():
        _check_array(key, payload[key], array_spec)
    norm = reply_update_norm(payload, spec) if spec.norm_bound is not None else None
    if norm is not None and spec.norm_bound is not None and norm > spec.norm_bound:
        raise ReplyRejected(f"update norm {norm:.4g} exceeds fed.norm_bound = {spec.norm_bound:.4g}")
    return payload
