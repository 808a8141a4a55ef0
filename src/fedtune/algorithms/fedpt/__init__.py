"""FedPT: federated proxy-tuning of a black-box large LM (the FedPT paper's Alg. 1; docs/methods.md).

Round t:
1. sample K clients and send them the small LM's LoRA state theta_s^t;
2. each client runs E local epochs of response-only SFT and returns its LoRA state (FedIT's task);
3. the server averages them weighted by example count -> theta_bar_s^{t+1};
4. the proxy-tuned large LM is ``z_l0 + alpha * (z_sbar - z_s0)`` (``fedtune.proxy.proxy_logits``);
5. the server distils it into theta_bar_s^{t+1} on the public set D_kd (eq. 5):
   ``(1 - lambda) * CE(y | x; theta_s) + lambda * KL(p_proxy || p_theta_s)`` over response tokens,
   with Prodigy (lr 1.0) and a cosine schedule within the round by default. The result is theta_s^{t+1}.
``fedpt.distill: false`` skips step 5: the FedAvg+PT baseline.

The output (Alg. 1 l.9) is the proxy over theta_bar_s^{t+1}, the aggregate *before* the round's
distillation: what is evaluated (the alpha search, the proxy's metrics, ``small/``) and the final
model. The distilled theta_s^{t+1} is what the clients are sent next round; it is the final-model
variant ``proxy-distilled`` / ``small-distilled`` and, with ``eval_distilled``, the ``distilled/``
metrics.

The large model is reached only through ``LogitSource`` (next-token logits, never weights), and
clients only ever receive the small model's LoRA state.

Choices the paper leaves open:
- The frozen part of the teacher, ``C = z_l0 - alpha * z_s0`` at D_kd's response positions, never
  changes for a given alpha: it is computed once per run and alpha (``teacher_cache``: ``disk`` =
  fp16/fp32 files in the run directory, reused on resume; ``memory``; ``recompute`` recomputes every
  round, the benchmark yardstick).
  fp16 storage rounds logits of magnitude <= 32 by at most 0.008.
- ``z_sbar`` comes from the aggregated model theta_bar_s^{t+1}, fixed for the whole distillation;
  it is computed per batch by swapping theta_bar into the LoRA weights for one no-grad forward, so
  memory holds one batch of logits rather than the whole public set's.
- The KL term runs over the shared vocabulary, the CE term over the small model's own.
- alpha is an evaluation-time knob: ``alpha_grid`` is searched on the validation split at the
  final round (``alpha_search``), with ``alpha_search_seeds`` sampling seeds on the first
  ``alpha_search_examples`` validation examples, and the best value decodes the test sets. It is
  picked by ``alpha_search_metric`` (default: the first generation metric of ``eval.metrics``);
  ``perplexity`` picks it deterministically from the proxy's labelled logits, decoding nothing.
  Round 0 (LoRA B = 0) is the base large model for any alpha.

Step 5's teacher runs at the alpha decoding uses (eq. (3) has one alpha): with ``teacher_alpha:
searched`` (the default) round t's teacher uses the alpha the latest search before round t chose, and
``fedpt.alpha`` before any search. With ``alpha_search: final`` the only search follows the last
distillation, so the teacher stays at ``fedpt.alpha``; ``alpha_search: every`` makes it follow the
search. ``teacher_alpha: fixed`` (``fedpt.alpha`` every round whatever the search chose) is the
ablation, and what runs made before the key existed used.

Layout: ``config`` (the ``fedpt:`` section), ``distillation`` (eq. 5, the teacher's parts, the
student step), ``client`` (the clients' task: FedIT's local SFT of the small LM), ``server`` (the
rounds, the distillation, the alpha search), ``final`` (the proxy-tuned LM a finished run is loaded
as).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedpt.config import FedPTConfig
    from fedtune.algorithms.fedpt.distillation import kd_loss
    from fedtune.algorithms.fedpt.final import ProxyModel, evaluate_proxy, load_proxy_model
    from fedtune.algorithms.fedpt.server import FedPT

__all__ = ["FedPT", "FedPTConfig", "ProxyModel", "evaluate_proxy", "kd_loss", "load_proxy_model"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedPT": "fedtune.algorithms.fedpt.server",
        "FedPTConfig": "fedtune.algorithms.fedpt.config",
        "ProxyModel": "fedtune.algorithms.fedpt.final",
        "evaluate_proxy": "fedtune.algorithms.fedpt.final",
        "kd_loss": "fedtune.algorithms.fedpt.distillation",
        "load_proxy_model": "fedtune.algorithms.fedpt.final",
    },
)
