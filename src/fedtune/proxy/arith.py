"""The proxy-tuning logit arithmetic (FedPT eq. 3; eq. 12 in probability form).

``z_proxy = z_large + alpha * (z_tuned - z_base)`` per position. Raw logits and log-softmax give
the same distribution after the softmax (they differ by a per-position constant), so raw logits
are used: no normalisation pass over the vocabulary is needed.
"""

from __future__ import annotations

from torch import Tensor


def proxy_logits(
    large: Tensor, tuned: Tensor, base: Tensor, alpha: float, vocab_size: int | None = None
) -> Tensor:
    """``large + alpha * (tuned - base)`` over the first ``vocab_size`` ids, in float32.

    The three inputs share their leading dimensions (``[..., V_i]``); each is truncated to the
    shared vocabulary (default: the narrowest of the three), as extra trailing ids of one model
    have no counterpart in the other.
    """
    width = vocab_size or min(large.shape[-1], tuned.shape[-1], base.shape[-1])
    if min(large.shape[-1], tuned.shape[-1], base.shape[-1]) < width:
        raise ValueError(
            f"vocab_size {width} exceeds a model's logit width "
            f"(large {large.shape[-1]}, tuned {tuned.shape[-1]}, base {base.shape[-1]})"
        )
    out = large[..., :width].float()
    if alpha == 0.0:
        return out.clone()
    return out + alpha * (tuned[..., :width].float() - base[..., :width].float())
