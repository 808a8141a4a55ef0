"""FedPFT: federated proxy fine-tuning with a sub-model aligned by layer- and neuron-level distillation.

Paper: "FedPFT: Federated Proxy Fine-Tuning of Foundation Models" (sec. 3.4-3.6).

- **Sub-model** (sec. 3.4): in every layer, FFN neuron ``i``'s saliency is the squared norm of its
  input row(s) plus its output column (`fedtune.models.ffn`); the top ``keep_ratio`` neurons stay,
  ``keep_layers`` (first and last by default) keep their FFN whole. Attention, embeddings, norms and
  the task head are untouched, so the trainable part -- LoRA on q, k, v, o and the head -- has the same
  names and shapes in the full model and the sub-model.
- **Layer-level distillation** before federated learning (eq. 13, `fedtune.train.ffn_distill`):
  ``distill_steps`` AdamW steps on public data of the per-layer hidden-state MSE between the full and
  the sub-model plus ``mu`` ||W_out W_in - W_out' W_in'||^2 (with gradient; ``mu: 0`` is what the
  official code effectively does); only the compressed layers' FFNs train.
- **Rounds**: sampled clients receive the LoRA + head, plus the sub-model's frozen part (embeddings,
  attention, norms; once) and its FFNs (when their version changed: after each neuron-level
  distillation); they train LoRA + head with cross-entropy and reply with them; FedAvg weighted by
  example count. The full model's FFN weights of a compressed layer never leave the server (asserted
  on the wire by the tests).
- **Neuron-level distillation** (eq. 14) after every ``neuron_every``-th round (not after the last):
  the round's clients report per-neuron APoZ on their own data (task ``apoz``); the server aggregates
  them (weighted by token positions), freezes the ``freeze_fraction`` of each compressed layer's
  neurons with the lowest APoZ (the most active on client data) and runs ``neuron_steps`` steps of
  eq. 13 on public data updating only the other neurons.
- **Evaluation**: the final LoRA + head plugged into the full model (metrics ``accuracy``,
  ``macro_f1``), and on the sub-model (``sub/accuracy``, ``sub/macro_f1``).

Baselines and ablations as settings: FedPETuning = ``submodel: full``; FedOT = ``submodel:
layerdrop`` (the first and last ``edge_layers`` layers and a uniform ``1 - drop`` share of the middle
ones, with FedBiOT's surgery, distilled as below). As in Offsite-tuning, LoRA trains on the adapter
only -- the ``edge_layers`` layers at each end -- and the head, while the emulator's middle layers stay
as sent;
the adapter's LoRA + head plug into the full model at their original indices. ``emulator_lora:
true`` also trains LoRA on the emulator's layers (a variant: those layers then get updates too,
which the paper's argument says layer drop cannot give the intermediate layers). FedPFT without
layer-level distillation = ``distill_steps: 0``; without neuron-level distillation =
``neuron_every: 0``.

The package: ``config`` (the ``fedpft:`` section), ``maths`` (FedOT's adapter layers, seeded samples),
``distill`` (the distillations' public batches and gradient masks), ``wire`` (what travels: the
layout, the parts of the client model, all keyed like the full model; the LoRA that names them; FedOT's
emulator layers), ``client`` (its tasks: all a client holds is the model it was
sent and its data), ``server`` (the full model, derivation and distillations, rounds, evaluation,
state) and ``final`` (the full classifier with the final LoRA + head).

Choices where the paper is silent, and deviations:
- Deviation: ``keep_layers`` defaults to ``[0, -1]`` (set explicitly in every paper config), so the
  first and last layers keep their FFN whole, where sec. 3.4 compresses the FFN of every transformer
  layer. The paper's BERT-base experiments cut layers 1-10 of 12 and keep the first and last, which
  the default follows; ``keep_layers: []`` compresses every layer, as sec. 3.4 reads. On 6-layer
  all-MiniLM-L6-v2 the default keeps 2 of 6 FFNs whole (the paper: 2 of 12).
- APoZ counts an activation as zero when it is <= 0, i.e. where the pre-activation is negative: the
  rule of ReLU's APoZ carried over to GELU and SiLU, which give a small negative output (at least
  -0.17 for GELU, -0.28 for SiLU) for every negative input. The authors' code counts outputs that
  are exactly zero after GELU; in fp32 that happens only for pre-activations below about -5.5 (-5.06
  for the tanh approximation) and never for SiLU. Measured on SmolLM2-135M (SiLU gates, 547 tokens of
  ``wordnet-lexclass``): 61.7% of gate pre-activations are <= 0, 0% of SiLU outputs are exactly 0 and
  0.02% of pre-activations are below -5.5, so the exact-zero rule gives every neuron an APoZ of about
  0 and the neurons to freeze would be picked by ties. The activation is the nonlinearity's output:
  BERT's GELU(x W_in); a gated decoder's SiLU(x W_gate) (not its product with x W_up, whose sign is
  also up's), which is <= 0 exactly where x W_gate is; over non-pad tokens, on up to
  ``apoz_examples`` examples per client.
- Both distillations run with the current global LoRA loaded into the full model and the sub-model,
  in eval mode (no dropout); layers kept whole are never trained, so they stay equal to the full model's.
- The hidden-state MSE is averaged over non-pad positions of each layer and summed over layers.
- Options closer to the authors' code, all off by default: ``hidden_loss: layer_relative`` (each
  layer's squared error over the full model's squared norm at the same positions), ``distill_norms``
  (the compressed layers' FFN output LayerNorm trains and travels with their FFN), ``distill_schedule:
  cosine`` with ``distill_warmup_ratio`` (linear warmup, then cosine decay, in each distillation).
- A pair's segment ids (``token_type_ids``) travel with its tokens into client training, evaluation,
  both distillations and the APoZ counts (``fedtune.data.classify``).
- ``hidden_loss: token_relative`` (an option; the default ``mse`` is eq. 13) divides each position's
  squared error by the full model's squared norm there before averaging. Decoders (SmolLM2, Llama)
  carry activations ~1e3 times larger than elsewhere on their first token from the middle layers on,
  so eq. 13's plain MSE is almost entirely that one position (measured on SmolLM2-135M with 75% of
  the FFN neurons cut: MSE 7e5 at position 0 against 20-30 at the others), and distilling it leaves
  the positions the classifier reads untouched.
- LoRA goes on ``lora.target_modules``; its ``auto`` default is every layer's attention projections
  (q, k, v, o, as the paper), not the q, v of the generative methods (``wire.ATTENTION_TARGETS``).
- Sequence classification reads a record's ``instruction`` (and ``input`` as a second segment when
  set); its class is its ``label`` for multiple-choice records, else its ``output`` among the class
  names (``labels``, the choices, or a built-in set's categories). ``eval.metrics`` does not apply:
  the metrics are always accuracy and macro-F1 (in [0, 1]).
- FedOT's emulator is distilled as Offsite-tuning builds it (``emulator_distill``, the default): its
  middle layers train, before federated learning, so that the hidden state entering the top adapter
  matches the full model's there (one compared state, Offsite-tuning's normalised MSE, i.e.
  ``layer_relative``; no LM term), with FedPFT's
  layer-level budget (``distill_steps``, ``distill_lr``, the public set). ``emulator_distill: false``
  sends the emulator as cut: the ablation measuring layer drop without alignment.
- The initial distillation is repeated on resume (it is deterministic); the checkpoint's FFNs then
  replace its result.
"""

from typing import TYPE_CHECKING

from fedtune.lazy import lazy_exports

if TYPE_CHECKING:
    from fedtune.algorithms.fedpft.config import FedPFTConfig
    from fedtune.algorithms.fedpft.server import FedPFT

__all__ = ["FedPFT", "FedPFTConfig"]

# The parts load on first use: validating a config imports only ``config``, not torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "FedPFT": "fedtune.algorithms.fedpft.server",
        "FedPFTConfig": "fedtune.algorithms.fedpft.config",
    },
)
