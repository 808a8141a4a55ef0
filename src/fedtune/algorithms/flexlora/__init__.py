"""FlexLoRA: heterogeneous LoRA ranks by full-size aggregation and SVD redistribution (Bai et al.,
"Federated Fine-tuning of Large Language Models under Heterogeneous Tasks and Client Resources",
NeurIPS 2024).

Client i trains LoRA at its own rank r_i (``flexlora.ranks``, assigned as ``algorithms.hetrank`` says).
The server forms each reply's full-size product and their mean weighted by data size,

    W = sum_i (n_i / sum_j n_j) B_i A_i          (per LoRA module, d_out x d_in)

and sends client i the best rank-r_i approximation of W by truncated SVD, W = U S V^T:
B_i = U_{r_i} S_{r_i}, A_i = V_{r_i}^T.

What we implement and where it deviates:

- Sigma goes into B (B = U_r S_r, A = V_r^T). Splitting S_r^{1/2} onto both factors gives the same product
  and differs only in how local training moves the factors; public implementations differ on this.
- Before the first aggregation (round 1) each client is sent the seeded initial adapter truncated to its
  rank (B = 0), not an SVD of the zero product.
- The global model is W itself; the adapter the server evaluates and saves as the final model is its best
  rank-``lora.r`` approximation (a standard peft adapter at ``lora.r``), so ranks of W beyond ``lora.r``
  (possible when the clients' ranks sum above it) are not in the evaluated model.
- Under a robust ``fed.aggregator`` (median, trimmed mean) that rule replaces the data-weighted mean of
  the products (a fedtune option, not the paper's).
- Every client uses LoRA's scaling ``lora.alpha / lora.r`` (not ``alpha / r_i``), so the adapter it is
  sent computes exactly the truncated product.
- DP and secure aggregation are refused (``FlexLoRAConfig.dp_refused``): the mean of products is not a
  mean of the replies, so clipping or summing the factors bounds neither.

Layout: ``config`` (the ``flexlora:`` section), ``maths`` (product mean, SVD factors), ``client`` (the
fit task), ``server`` (the rounds).
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.flexlora.config import FlexLoRAConfig
    from fedtune.algorithms.flexlora.maths import product_mean, svd_factors
    from fedtune.algorithms.flexlora.server import FlexLoRA

__all__ = ["FlexLoRA", "FlexLoRAConfig", "product_mean", "svd_factors"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FlexLoRA": "fedtune.algorithms.flexlora.server",
        "FlexLoRAConfig": "fedtune.algorithms.flexlora.config",
        "product_mean": "fedtune.algorithms.flexlora.maths",
        "svd_factors": "fedtune.algorithms.flexlora.maths",
    },
)
