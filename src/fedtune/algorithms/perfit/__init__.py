"""PerFIT: personalised federated instruction tuning by a per-client sparse LoRA architecture search.

Paper 002 (Alg. 1-3, sec. 4.1), as docs/methods.md specifies. Every client has its own sparse LoRA
(a personal mask over one shared expanded module) on the attention projections
(``lora.target_modules``; the paper's q, k, v) of the frozen base LLM:

1. **Search** (Alg. 1; once per client, on its own training data, before round 1: the server asks
   every client for its mask at the start of the first round): the LoRA is expanded to rank
   ``r_e = round(r / (1 - s))`` (or ``expanded_rank``) and initialised symmetrically, A and B ~
   N(0, 1/d) (zero-init B would make A's importance vanish), one initialisation for all clients
   (Alg. 2's input Delta theta_0; seeded by the run). For t = 1..T_p the client accumulates gradients
   over its local batches (``search_batches`` of them per step; default all), scores every entry (first
   order ``|g w|``, second order ``|w H w|`` or mixed ``|g w - w H w / 2|``, with H the empirical Fisher
   diagonal: the mean over batches of the squared batch gradient) and keeps the
   ``round(N (k / N)^(t / T_p))`` highest-scoring entries of the N expanded ones (pruned entries are
   zeroed and stay pruned), so after T_p steps exactly k remain: the parameter count of a rank-r LoRA
   (the paper's ``I < tau`` keeps the *least* important: a typo). The mask goes to the server once, as
   packed bits; the client keeps it.
2. **Global module** (sec. 4.1 step 4): the server keeps a dense expanded module G, initialised to the
   same symmetric init the clients searched with.
3. **Training** (Alg. 2): each round the server sends every sampled client G at its mask (only the
   masked values travel); the client trains them (entries outside the mask are zero and get no
   gradient, ``fedtune.train.loop``'s gradient masks) and uploads only the masked values, a ragged
   array per module.
4. **Aggregation** (Alg. 3, ``maths.update_global``): every entry of G that some trained client holds
   becomes the example-weighted mean over those clients (``fed.aggregator: median``: their median); the
   other entries keep their value.
5. **Evaluation**: personalised -- every client with a mask is scored on G at its mask on its own
   held-out split (``eval.personal``, required; ``personal/``), and the round's trained clients also on
   the values they just trained (``personal_after_fit/``). Before the search (round 0) every client is
   the base model.

LoRA alpha of the expanded module is ``perfit.alpha``: ``rank`` (the default) = r_e, i.e. scaling 1,
as the paper keeps alpha equal to the rank (FIT's alpha = r); ``lora`` = ``lora.alpha`` (scaling
``lora.alpha / r_e``, peft's rule); or a number.

Heterogeneous resources: one common ``r_e`` and per-client budgets ``budgets`` (ranks, assigned
round-robin over the clients in order: c00 gets the first, c01 the second, ...), each kept count
being ``budget x`` the module's ``d_in + d_out`` summed over modules.

Ablation ``start: own`` (an earlier reading, not the paper's method): the server keeps only the masks;
a client searches when first sampled, resumes from its own values of the last round it trained in,
and after the round receives Alg. 3's mean at its entries (the ``update`` task); a client never
sampled is the base model. ``aggregate: false`` (with ``start: own`` only) skips Alg. 3: every client
keeps the masked values it trained (its uploads still travel, so the bytes stay comparable), which
separates what the sparse personal LoRA learns on its own from what the aggregation adds.

Choices where the paper is silent, and deviations:
- ``r_e`` is rounded to an integer (s = 0.33, r = 8 -> 12, as the paper does) and the schedule uses
  the kept count k of a rank-r LoRA, so the last step keeps exactly k entries even when
  ``r / (1 - s)`` is not an integer.
- The search ranks all of a client's LoRA entries together (one threshold, as Alg. 1's percentile
  of ``I``), ties broken by position; d in N(0, 1/d) is the adapted layer's input width. The search's
  gradients come from the response-only SFT loss, as training's.
- ``search_batches`` limits the batches each search step reads (default: all local batches, the
  paper's T_p passes over the local data).
- The paper does not say when it evaluates: both scores above are reported, named.

Layout: ``config`` (the ``perfit:`` section), ``maths`` (ranks, budgets, importance, the search's
schedule, Alg. 3's combination), ``search`` (Alg. 1 on the client's model), ``wire`` (masks and
masked values as they travel), ``client`` (search, training, the personalised update and evaluation:
everything a client holds), ``server`` (masks, rounds, Alg. 3).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.perfit.config import Importance, PerFITConfig
    from fedtune.algorithms.perfit.maths import (
        expanded_rank,
        importance_scores,
        keep_schedule,
        kept_count,
        symmetric_init,
        top_entries,
    )
    from fedtune.algorithms.perfit.search import local_gradients, search_masks
    from fedtune.algorithms.perfit.server import PerFIT
    from fedtune.algorithms.perfit.wire import MASK, VALUES

__all__ = [
    "MASK",
    "VALUES",
    "Importance",
    "PerFIT",
    "PerFITConfig",
    "expanded_rank",
    "importance_scores",
    "keep_schedule",
    "kept_count",
    "local_gradients",
    "search_masks",
    "symmetric_init",
    "top_entries",
]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "Importance": "fedtune.algorithms.perfit.config",
        "MASK": "fedtune.algorithms.perfit.wire",
        "PerFIT": "fedtune.algorithms.perfit.server",
        "PerFITConfig": "fedtune.algorithms.perfit.config",
        "VALUES": "fedtune.algorithms.perfit.wire",
        "expanded_rank": "fedtune.algorithms.perfit.maths",
        "importance_scores": "fedtune.algorithms.perfit.maths",
        "keep_schedule": "fedtune.algorithms.perfit.maths",
        "kept_count": "fedtune.algorithms.perfit.maths",
        "local_gradients": "fedtune.algorithms.perfit.search",
        "search_masks": "fedtune.algorithms.perfit.search",
        "symmetric_init": "fedtune.algorithms.perfit.maths",
        "top_entries": "fedtune.algorithms.perfit.maths",
    },
)
