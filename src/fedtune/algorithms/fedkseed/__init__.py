"""FedKSeed: federated full-parameter tuning by zeroth-order steps on K shared seeds.

Z. Qin, D. Chen, B. Qian, B. Ding, Y. Li and S. Deng, "Federated Full-Parameter Tuning of Billion-Sized
Language Models with Communication Cost under 18 Kilobytes", ICML 2024.

The server fixes K candidate seeds s_1..s_K for the run (``maths.candidate_seeds``). A client's local
step j picks a seed index k_j (uniformly, or by the paper's seed importance), regenerates
z = z(s_{k_j}) ~ N(0, I) over ALL the model's parameters, and with two forward passes (no graph)

    g_j = (L(w + eps z) - L(w - eps z)) / (2 eps);     w <- w - eta g_j z.

It replies with K scalars, the per-seed sums G_k = sum_{j: k_j = k} g_j, and the seeds. The server's
round is the example-weighted mean of the clients' K-vectors, Gbar, appended to the history; the
global model is never sent: every party (server, client, a client that joins late, the final model)
holds it as the initial weights with the history replayed,

    w_{t+1} = w_t - eta sum_k Gbar_{t,k} z(s_k)            (``maths.replay_round``),

which gives the same bits wherever it runs on the same device type. With one client this is exactly
that client's local trajectory (the steps are additive in z).

What we implement, and where we differ:
- Perturbation in place: +eps z, -2 eps z, +eps z back, then the step, each z regenerated from its seed
  one tensor at a time, as the paper (and MeZO) do; the model is in eval mode (no dropout) so the two
  passes see the same function. eta and eps are ``fedkseed.lr`` and ``fedkseed.eps`` (``train.lr`` and
  the optimizer are not used); the local step count is ``train.max_steps`` / ``train.local_epochs``.
- Seed sampling: ``uniform`` (default) or ``importance``: psi_k = mean over rounds of |Gbar_{t,k}|,
  min-max normalised, p = softmax(alpha psi) (``maths.seed_probabilities``; the server sends p).
  The paper's importance uses the clients' per-step scalars; we use the aggregated history, which is
  what every party holds.
- Aggregation: the mean is weighted by example count (FedAvg's weights; the paper averages over
  clients), through ``Algorithm.aggregate``, so ``fed.aggregator``, DP and SecAgg apply to the K-vector.
- Restoring after local steps: a client process keeps one model for all the clients it serves. After a
  client's local steps it copies the version's weights back from a host copy taken before them
  (``replica.SeedReplica.local_steps``), instead of taking the steps back (rounding leaves residue), so
  the next client (and a resumed run, and every backend) starts from the same bits. That copy costs one
  model's size in host memory during local steps; the accelerator still holds one model.
- Catching up: the server sends each sampled client the history rows since the version it last
  confirmed by a valid reply (all rows to a client it never heard from, and to every client after a
  server restart), or the model's arrays when those cost fewer bytes than the rows. A client process
  that restarted since holds an older version than the rows reach: it fails the round with the reason,
  and the server sends it the whole history next time.
- The final model is the base model with the history replayed: ``artifacts/fedkseed-history.npz``
  (seeds, history, eta) is the whole artifact; ``fedtune export`` writes it merged.
- DP: a client's K-vector is its update (against zeros); ``dp.clip_norm`` bounds its L2 norm, so the
  round's per-seed mean is a bounded mean and client-level DP applies as to any update. SecAgg: the
  K-vector (and the seeds, whose update is 0) stays on the client and is summed masked; the server then
  cannot check the seeds, only the statistics.
- ``restore`` (``fedkseed.restore``): ``copy`` (above, the default) or ``undo``, the paper's in-place way:
  the steps are taken back in reverse order, no copy, exact up to rounding (so a resumed run or another
  backend may differ in the last bits).
- Quantised bases are refused: every weight takes the steps.

Layout: ``config`` (the ``fedkseed:`` section), ``maths`` (seeds, perturbation, estimate, replay,
probabilities), ``replica`` (a process's model at a history version), ``client`` (the fit task),
``server`` (the rounds, the state, the final model).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedkseed.config import FedKSeedConfig
    from fedtune.algorithms.fedkseed.server import FedKSeed

__all__ = ["FedKSeed", "FedKSeedConfig"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedKSeed": "fedtune.algorithms.fedkseed.server",
        "FedKSeedConfig": "fedtune.algorithms.fedkseed.config",
    },
)
