"""FedMKT: federated mutual knowledge transfer between a server LLM and heterogeneous client SLMs.

Paper 001 (Alg. 1, Alg. 2, App. A, B), as docs/methods.md specifies. The server holds the LLM (the run's
``model:``) with a LoRA; each client holds its own SLM (``fedmkt.clients``; architectures and
tokenizers may differ) with its own LoRA, which never leaves it (except with ``slm_fedavg``). Every
party reads the same public set (the dataset's ``public`` split, ``public_examples`` of it).

Round t:
1. clients (task ``fit``): ``train:`` local SFT on their private data, then the loss of every public
   sample (mean CE over its response tokens) and the top-``top_k`` logits of every response token;
   only these travel (``wire``: fp16 values, narrowest unsigned ids, no offsets).
2. server: each client's top-k aligned to the LLM's tokenization (``fedtune.align``: minimum edit
   distance vocabulary map, DP alignment of the two tokenizations, 1:1 matches map the teacher's ids,
   other tokens a one-hot on the LLM's own token); DualMinCE picks per sample the client of least
   loss, kept only if below the LLM's own loss; the LLM's LoRA trains with
   ``lam CE(D_p) + (1 - lam) KD(selected)`` (``llm_train``).
3. server: the LLM's losses and top-k on the public set, sent to the clients (task ``distill``);
   each aligns them to its tokenizer, keeps the samples where the LLM's loss is below its own and
   trains its LoRA with the same mixed loss (``train:``).

Settings: Heterogeneous (``clients`` lists different SLMs), Homogeneous (one SLM for all;
``slm_fedavg: true`` averages their LoRA after local training, before distillation), One-to-One (one
client). Baselines: Zero-shot (round 0, ``eval.before``), Standalone (``fed.mode: standalone``: local
training only, nothing transferred), LLM2SLM (``llm_learns: false``: the LLM stays frozen and only
teaches), FedAvg (``fedit`` on the SLM), Centralized (``fed.mode: centralized``: one party tunes
``model:`` on the union of the clients' private data and the public set, as the paper) and the LLM on
the public set only (``lam: 1``, ``slm_learns: false``). Evaluation: the LLM on the test set (server),
every SLM on its client's held-out split (``eval.personal``).

The package: ``config`` (the ``fedmkt:`` section), ``transfer`` (DualMinCE, the mixed loss, the
alignment of knowledge between tokenizations), ``wire`` (what travels: losses and top-k only),
``client`` (a client's tasks, and what every party -- the server's LLM too -- computes with) and
``server`` (the LLM's side of each round, its evaluation and state).

Choices where the paper is silent, and deviations:
- KD is the soft-target cross-entropy against the softmax of the teacher's (aligned) top-k logits,
  renormalised over the entries left after mapping; a one-hot row is a hard target.
- Both loss terms are sums over the batch's response tokens divided by their count (CE over every
  token, KD over the tokens of selected samples), so ``lam`` weighs per-token contributions.
- Token ``t``'s teacher row is the distribution that predicts ``t`` (logits at ``t - 1``); alignment
  matches token to token. Only response tokens carry knowledge (the loss is on responses only);
  a receiver token matched to a sender's prompt token gets a one-hot.
- Each SLM's losses used by its own DualMinCE are those it computed right after local training
  (step 1), as in Alg. 1; the LLM's own losses are computed just before its training.
- The top-k is taken over the tokenizer's ids only (padded embedding rows name no token).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedmkt.config import FedMKTConfig
    from fedtune.algorithms.fedmkt.server import FedMKT
    from fedtune.algorithms.fedmkt.transfer import dual_min_ce, mixed_loss, soft_target_ce

__all__ = ["FedMKT", "FedMKTConfig", "dual_min_ce", "mixed_loss", "soft_target_ce"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedMKT": "fedtune.algorithms.fedmkt.server",
        "FedMKTConfig": "fedtune.algorithms.fedmkt.config",
        "dual_min_ce": "fedtune.algorithms.fedmkt.transfer",
        "mixed_loss": "fedtune.algorithms.fedmkt.transfer",
        "soft_target_ce": "fedtune.algorithms.fedmkt.transfer",
    },
)
