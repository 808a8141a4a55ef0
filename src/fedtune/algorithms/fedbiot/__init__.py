"""FedBiOT (bi-level offsite tuning), with Offsite-tuning and FedOT as settings of the same algorithm.

Paper: "FedBiOT: A Solution for Federated Large Language Model Fine-Tuning with Intellectual Property
Protection" (anonymous submission, 2024; Alg. 2, eq. 1-2), as docs/methods.md specifies.

The server holds the LLM and never sends it. LayerExtract (`fedtune.models.surgery`) splits its n
decoder layers into an adapter A (the last s layers) and the non-compressed emulator E* (the rest);
the emulator E keeps ``floor((1 - d)(n - s))`` of E*'s layers at a uniform stride. Clients receive the
emulator model = embeddings + E + A + final norm + head, and train only A.

- **Setup**: E is distilled for ``init_steps`` (I_0) steps of eq. (2) on the public set.
- **Round t**: the server first takes ``align_steps`` (E) more steps of eq. (2) with the current adapter
  -- normalised hidden-state MSE between E's and E*'s outputs on the same input
  (``||E(h) - E*(h)||^2 / ||E*(h)||^2``) + ``align_lambda`` x KL(M(x; A, E) || M(x; A, E*)) over
  every non-pad position; only E trains (SGD by default, as the paper). It then sends each sampled
  client the adapter, plus the emulator if that client does not hold the current version, plus the
  frozen parts (embeddings, norm, head; in LoRA mode the adapter layers' base weights) on first
  contact. Clients run ``train.max_steps`` (K) local steps on the adapter with the proximal term
  ``prox_eps`` (the gradient of eps/2 ||w_A - w_A^(t)||^2 is eq. (1)'s eps (w_A - w_A^(t))) and reply
  with it; the server averages the sampled clients' adapters weighted by example count (a deviation,
  below).
- **Evaluation**: both outputs at every eval round: AdapEmu (A + E, metric prefix ``adapemu/``) and
  AdapFu (A + E*, i.e. the adapter plugged back into the full model, prefix ``adapfu/``).
- **Metrics row**: ``adapter_shift`` (the mean over the replies of ||A sent up - A sent down||_2) and
  ``adapter_shift_pct`` (the same in percent of ||A sent down||): the distance the proximal term acts on;
  not logged under secure aggregation, where the server never sees one client's adapter.

Baselines: **FedOT** = ``split: first_last`` (adapter = first 2 + last 2 layers), ``align_steps: 0``
(emulator fixed after the initial distillation), ``prox_eps: 0``, ``align_lambda: 0`` (their emulator
is distilled by the normalised hidden-state MSE alone: their own objective is a relative MSE plus the LM
loss, of which fedtune has the MSE; FedBiOT's KL term is no part of it); **Offsite-tuning** = FedOT with
``fed.mode: centralized`` (one client holding all data).

Adapter training is the full adapter layers (paper) or LoRA on them (``adapter_mode: lora``).
Weights travel keyed by their layer's *original* index, so the traffic shows which layers leave the
server; a dropped E* layer never does (asserted on the wire by the tests).

The package: ``config`` (the ``fedbiot:`` section), ``emulator`` (the split, the alignment of eq. 2),
``wire`` (what travels, keyed by original layer index), ``client`` (the ``fit`` task: all a client
holds is the emulator model it was sent and its data), ``server`` (the full model, the rounds, the
evaluation, the state) and ``final`` (AdapFu / AdapEmu of a finished run).

Choices where the paper is silent, and deviations:
- The public set defaults to the training dataset's ``public`` split; ``public_dataset`` names another
  built-in (the paper distils on Alpaca for every task; our configs use ``wordnet-instruct``, a
  general instruction set, likewise shifted from the math and code tasks).
- The KL and MSE terms are averaged over all non-pad positions of a public batch (public data may be
  unlabelled); the MSE is normalised by the teacher's mean square as docs/methods.md specifies.
- The KL term is eq. (2)'s D_KL(M(x; A, E) || M(x; A, E*)), the emulator model's distribution first
  (``kl_order: emulator_first``, the default; the paper's prose names the full model first). The usual
  distillation order KL(M(x; A, E*) || M(x; A, E)) (``train.losses.distillation_kl``, teacher first,
  as FedPT's distillation) is the ablation ``kl_order: full_first``, which runs made before the key
  existed used.
- Deviation: each round trains the ``fed.clients_per_round`` sampled clients and averages their
  adapters weighted by example count (FedAvg's p_m of eq. (1) and Step 3, which leave p_m open), where
  Alg. 1 trains all M clients and averages uniformly (1/M, l. 15). The paper configs sample 3 of 10
  (QA) and 3 of 9 (code) clients to fit the CPU budget; math trains all 3 (equal sizes, so uniform).
- The initial (I_0-step) distillation runs with the initial adapter (the pretrained layers) and is
  cached under ``<run>/fedbiot/`` with a fingerprint, so resuming does not repeat it; ``init_cache``
  names a directory where runs with the same fingerprint (e.g. Offsite-tuning and FedOT, or an eps
  sweep) share it.
- The server does not checkpoint which emulator version each client holds: after a resume every client
  receives the emulator again on first contact (weights and metrics are unchanged; bytes of that round
  are higher). Clients keep received weights in process memory, or also on their own disk
  (``client_cache: disk``; ``auto`` = disk on Flower, whose ClientApp process lives for one message)
  so a restarted client process need not be re-sent what it has.
- A client whose task fails is assumed to hold nothing; the next time it is sampled it gets everything.
- The alignment (eq. 2) runs student and teacher without dropout (eval mode), so the student matches
  the same deterministic function it is compared with; gradients are clipped at ``align_clip_norm``.
  The per-round alignment keeps one optimizer for the whole run (checkpointed, so resume is exact);
  the initial distillation has its own.
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedbiot.config import FedBiOTConfig
    from fedtune.algorithms.fedbiot.emulator import AlignStats, align_emulator, make_split
    from fedtune.algorithms.fedbiot.final import load_final_fedbiot
    from fedtune.algorithms.fedbiot.server import FedBiOT
    from fedtune.fl.broadcast import ClientCacheMiss

__all__ = [
    "AlignStats",
    "ClientCacheMiss",
    "FedBiOT",
    "FedBiOTConfig",
    "align_emulator",
    "load_final_fedbiot",
    "make_split",
]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "AlignStats": "fedtune.algorithms.fedbiot.emulator",
        "ClientCacheMiss": "fedtune.fl.broadcast",
        "FedBiOT": "fedtune.algorithms.fedbiot.server",
        "FedBiOTConfig": "fedtune.algorithms.fedbiot.config",
        "align_emulator": "fedtune.algorithms.fedbiot.emulator",
        "load_final_fedbiot": "fedtune.algorithms.fedbiot.final",
        "make_split": "fedtune.algorithms.fedbiot.emulator",
    },
)
