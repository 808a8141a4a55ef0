"""What the heterogeneous-rank LoRA methods share (HetLoRA, ``algorithms.hetlora``; FlexLoRA,
``algorithms.flexlora``): each client trains LoRA at its own rank r_i, the rank its memory allows.

The ranks come from the method's ``ranks`` list, assigned round-robin in the federation's client order
(client i gets ``ranks[i % len(ranks)]``); every rank is at most ``lora.r``, the rank of the global
adapter the server keeps. A client is sent the global adapter's first r_i ranks (rows of A, columns of
B), trains them with the padded ranks frozen at zero, and replies at rank r_i; a reply at another rank
is rejected. Both methods keep the global adapter at ``lora.r`` and LoRA's scaling ``lora.alpha /
lora.r`` for every client, so a truncated adapter computes exactly the truncated product.

Layout: ``config`` (the ``ranks`` check), ``maths`` (truncation, zero-padding, products, the rank
assignment), ``client`` (training at rank r_i), ``server`` (messages and reply specs per rank).
"""
