"""Proxy-tuning: steer a black-box large LM with the logit difference of a tuned and an untuned small LM."""

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
