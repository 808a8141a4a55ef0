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
round fails with the reason.

One side per module, as Flower's SecAgg+ splits it: ``crypto`` (key agreement, the mask generator,
Shamir sharing and share encryption), ``quantisation``, ``client`` (the update task's wrap and the four
client tasks) and ``server`` (the secure sum stage by stage, the run's protocol state and the federation
wrapper). What clip bound and quantisation range a run uses is decided in ``fl.release``.
"""

from fedtune.fl.secagg.client import STATE, TASKS, UPDATE, client_tasks, secure_update_task
from fedtune.fl.secagg.quantisation import dequantize_sum, quantization_step, quantize
from fedtune.fl.secagg.server import (
    SecAggFailed,
    SecAggSettings,
    SecureAggregation,
    SecureFederation,
    SecureSum,
    neighbourhood_size,
    neighbourhoods,
    secure_sum,
)

__all__ = [
    "STATE",
    "TASKS",
    "UPDATE",
    "SecAggFailed",
    "SecAggSettings",
    "SecureAggregation",
    "SecureFederation",
    "SecureSum",
    "client_tasks",
    "dequantize_sum",
    "neighbourhood_size",
    "neighbourhoods",
    "quantization_step",
    "quantize",
    "secure_sum",
    "secure_update_task",
]
