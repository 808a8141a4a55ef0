"""HetLoRA: heterogeneous LoRA ranks with rank self-pruning and sparsity-weighted aggregation (Cho et
al., "Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation Models", 2024).

Client i holds rank r_i (``hetlora.ranks``, assigned as ``algorithms.hetrank`` says). Round t: client i is
sent the global adapter truncated to its rank (A[:r_i], B[:, :r_i]) and trains it on

    loss_i = SFT loss + lambda * sum_m ||B_m[:, k:r_i] A_m[k:r_i]||_F,   k = max(min_rank, floor(gamma r_i))

(rank self-pruning: the tail k..r_i-1 is pushed towards zero). When the tail's norm at the end of a round
is below the client's value of its previous round, the client prunes the tail: its rank becomes k for the
rounds to come. The server zero-pads every reply to ``lora.r`` and averages A and B with sparsity weights

    p_i = ||B_i A_i||_F / sum_j ||B_j A_j||_F      (per LoRA module)

What we implement and where it deviates:

- The pruning rule is the client's, computed by the server on the reply (which holds the same numbers):
  clients keep no state between rounds, and the server, which must know each client's rank to validate
  its next reply, records the new rank and the last tail norm (``state_dict``, for exact resume). A round
  that prunes aggregates the reply without its tail.
- Sparsity weights are per LoRA module (each module's product norm), falling back to equal weights where
  every client's product is zero. The tail, gamma (the kept fraction), lambda and ``min_rank`` are our
  parametrisation of the paper's rule; defaults are ours.
- Under a robust ``fed.aggregator`` (median, trimmed mean) that rule replaces the sparsity-weighted mean
  over the zero-padded adapters (a fedtune option, not the paper's).
- The reported ``train_loss`` includes the regulariser (lambda x the tail norm per step).
- Every client uses LoRA's scaling ``lora.alpha / lora.r`` (not ``alpha / r_i``), so the adapter it is
  sent computes exactly the truncated product.
- DP and secure aggregation are refused (``HetLoRAConfig.dp_refused``): the weights depend on the
  updates, so the aggregate is not a fixed-weight mean.

Layout: ``config`` (the ``hetlora:`` section), ``maths`` (tail, regulariser, pruning rule, sparsity
weights), ``client`` (the fit task), ``server`` (the rounds).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.hetlora.config import HetLoRAConfig
    from fedtune.algorithms.hetlora.maths import sparsity_weighted_mean, sparsity_weights
    from fedtune.algorithms.hetlora.server import HetLoRA

__all__ = ["HetLoRA", "HetLoRAConfig", "sparsity_weighted_mean", "sparsity_weights"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "HetLoRA": "fedtune.algorithms.hetlora.server",
        "HetLoRAConfig": "fedtune.algorithms.hetlora.config",
        "sparsity_weighted_mean": "fedtune.algorithms.hetlora.maths",
        "sparsity_weights": "fedtune.algorithms.hetlora.maths",
    },
)
