"""Proxy-tuning: steer a black-box large LM with the logit difference of a tuned and an untuned small LM."""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.proxy.arith import proxy_logits
    from fedtune.proxy.decode import ProxyTunedLM
    from fedtune.proxy.source import LocalLogitSource, LogitSource
    from fedtune.proxy.vocab import VocabMismatch, shared_vocab_size

__all__ = [
    "LocalLogitSource",
    "LogitSource",
    "ProxyTunedLM",
    "VocabMismatch",
    "proxy_logits",
    "shared_vocab_size",
]

# The parts load on first use: FedPT's config checks a URL with ``api_url`` alone, without torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "LocalLogitSource": "fedtune.proxy.source",
        "LogitSource": "fedtune.proxy.source",
        "ProxyTunedLM": "fedtune.proxy.decode",
        "VocabMismatch": "fedtune.proxy.vocab",
        "proxy_logits": "fedtune.proxy.arith",
        "shared_vocab_size": "fedtune.proxy.vocab",
    },
)
