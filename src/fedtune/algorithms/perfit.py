"""PerFIT: personalised federated instruction tuning by a per-client sparse LoRA architecture search.

Paper 002 (Alg. 1-3), as METHODS.md specifies. Every client holds its own sparse LoRA on the
attention projections (``lora.target_modules``; the paper's q, k, v) of the frozen base LLM:

1. **Search** (Alg. 1; once, the first time a client is sampled, on its own training data): the LoRA
   is expanded to rank ``r_e = round(r / (1 - s))`` and initialised symmetrically, A and B ~ N(0, 1/d)
   (zero-init B would make A's importance vanish), one initialisation for all clients (Alg. 2's
   input Delta theta_0; seeded by the run). For t = 1..T_p the client accumulates gradients
   over its local batches, scores every entry (first order ``|g w|``, second order ``|w H w|`` or mixed
   ``|g w - w H w / 2|``, with H the empirical Fisher diagonal: the mean over batches of the squared
   batch gradient) and keeps the ``round(N (k / N)^(t / T_p))`` highest-scoring entries of the N
   expanded ones (pruned entries are zeroed and stay pruned), so after T_p steps exactly k remain:
   the parameter count of a rank-r LoRA (the paper's ``I < tau`` keeps the *least* important: a
   typo). The mask goes to the server once, as packed bits.
2. **Training** (Alg. 2): the sampled clients train their masked LoRA from where they are (entries
   outside the mask are zero and get no gradient, ``fedtune.train.loop``'s gradient masks) and upload
   only the masked values, a ragged array per module.
3. **Aggregation** (Alg. 3): every entry becomes the example-weighted mean over the sampled clients
   whose mask holds it (``fl.aggregate.masked_average``); each of those clients receives that mean
   times its own mask (only its masked values travel). Unsampled clients keep their modules.
4. **Evaluation**: personalised -- each client's own model on its own held-out split
   (``eval.personal``, required); a client never sampled yet is the base model.

Heterogeneous resources: one common ``r_e`` and per-client budgets ``budgets`` (ranks, assigned
round-robin over the clients in order: c00 gets the first, c01 the second, ...), each kept count
being ``budget x`` the module's ``d_in + d_out`` summed over modules.

Choices where the paper is silent, and deviations:
- ``r_e`` is rounded to an integer (s = 0.33, r = 8 -> 12, as the paper does) and the schedule uses
  the kept count k of a rank-r LoRA, so the last step keeps exactly k entries even when
  ``r / (1 - s)`` is not an integer.
- The search ranks all of a client's LoRA entries together (one threshold, as Alg. 1's percentile
  of ``I``), ties broken by position; d in N(0, 1/d) is the adapted layer's input width.
- LoRA's scaling is ``lora.alpha / r_e`` (peft's rule on the expanded module; the paper keeps
  ``alpha = r``). The search's gradients come from the response-only SFT loss, as training's.
- ``search_batches`` limits the batches each search step reads (default: all local batches, the
  paper's T_p passes over the local data).
- ``aggregate: false`` is an ablation, not the paper's method: Alg. 3 is skipped and every client
  keeps the masked values it trained (its uploads still travel, so the bytes stay comparable). It
  separates what the sparse personal LoRA learns on its own from what the aggregation adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtune.algorithms.adapters import client_examples, fit_round_result
from fedtune.algorithms.base import (
    PERSONAL_EVAL,
    Algorithm,
    RoundResult,
    derive_seed,
    evaluate_model,
    personal_reply,
)
from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.algorithms.local import REPLY_SCALARS, fit_scalars, train_selected
from fedtune.config import AlgorithmConfig, ExperimentConfig
from fedtune.data.tokenize import make_batches
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import gather_masked, masked_average, pack_mask, scatter_masked, unpack_mask
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ArraySpec, ReplySpec
from fedtune.models.lora import adapter_arrays, adapter_parameters, attach_lora, load_adapter
from fedtune.train.losses import response_nll

MASK = "mask/"
VALUES = "values/"
Importance = Literal["first", "second", "mixed"]


class PerFITConfig(AlgorithmConfig):
    """PerFIT's search and budgets; LoRA rank ``lora.r`` is the budget r, ``lora.target_modules`` the
    adapted projections."""

    personal_eval = True
    requires_personal_eval = True

    sparsity: float = Field(0.5, gt=0, lt=1)
    expanded_rank: int | None = Field(None, ge=1)
    budgets: list[int] | None = None
    search_steps: int = Field(5, ge=1)
    importance: Importance = "first"
    search_batches: int | None = Field(None, ge=1)
    # Ablation (not in the paper): false skips Alg. 3, each client keeps the values it trained.
    aggregate: bool = True

    @model_validator(mode="after")
    def _check_budgets(self) -> PerFITConfig:
        if self.budgets is not None and (not self.budgets or min(self.budgets) < 1):
            raise ValueError("perfit.budgets must be a non-empty list of positive ranks")
        return self


# ------------------------------------------------------------------------------------------- maths
def expanded_rank(rank: int, sparsity: float) -> int:
    """r_e = round(r / (1 - s)): 8 -> 12 at s = 0.33, 16 at s = 0.5."""
    return max(rank, round(rank / (1 - sparsity)))


def keep_schedule(total: int, final: int, step: int, steps: int) -> int:
    """Entries kept after search step ``step`` of ``steps``: round(total (final / total)^(step / steps)).

    The pruned fraction ``1 - (final / total)^(t / T_p)`` is the paper's ``1 - (1 - s)^(t / T_p)``;
    the last step keeps exactly ``final``.
    """
    if step >= steps:
        return final
    return max(final, round(total * (final / total) ** (step / steps)))


def importance_scores(
    weight: np.ndarray, grad: np.ndarray, fisher: np.ndarray, kind: Importance
) -> np.ndarray:
    """Per-entry importance (eq. 2-4): first |g w|, second |w H w|, mixed |g w - w H w / 2|; H = Fisher."""
    first = grad * weight
    second = weight * fisher * weight
    if kind == "first":
        return np.abs(first)
    if kind == "second":
        return np.abs(second)
    return np.abs(first - 0.5 * second)


def top_entries(
    scores: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray], count: int
) -> dict[str, np.ndarray]:
    """Masks keeping the ``count`` highest scores among the entries ``current`` holds, over all keys
    together; ties go to the earlier entry (keys in order, entries in C order)."""
    keys = list(scores)
    flat = np.concatenate([np.where(current[k], scores[k], -np.inf).ravel() for k in keys])
    if count > int(np.isfinite(flat).sum()):
        raise ValueError(f"cannot keep {count} entries: only {int(np.isfinite(flat).sum())} are left")
    order = np.argsort(-flat, kind="stable")[:count]
    chosen = np.zeros(flat.size, dtype=bool)
    chosen[order] = True
    masks, offset = {}, 0
    for key in keys:
        size = scores[key].size
        masks[key] = chosen[offset : offset + size].reshape(scores[key].shape)
        offset += size
    return masks


def symmetric_init(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """A and B ~ N(0, 1/d), d the adapted layer's input width (A's second dimension)."""
    rng = np.random.default_rng(seed)
    width: dict[str, int] = {}
    for key, shape in shapes.items():
        if "lora_A" in key:
            width[key.replace("lora_A", "lora_B")] = shape[1]
            width[key] = shape[1]
    return {
        key: rng.normal(0.0, 1.0 / np.sqrt(width[key]), size=shape).astype(np.float32)
        for key, shape in shapes.items()
    }


def kept_count(shapes: Mapping[str, tuple[int, ...]], rank: int) -> int:
    """Entries of a rank-``rank`` LoRA on the same modules: rank x (d_in + d_out) summed over modules."""
    return sum(rank * (shape[1] if "lora_A" in key else shape[0]) for key, shape in shapes.items())


# --------------------------------------------------------------------------------------- algorithm
class PerFIT(Algorithm[PerFITConfig]):
    name = "perfit"
    Config = PerFITConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.masks: dict[str, dict[str, np.ndarray]] = {}
        """client -> module key -> packed mask bits (what each client sent once)."""
        self.shapes: dict[str, tuple[int, ...]] = {}

    # ----- models --------------------------------------------------------------------------------
    @property
    def rank_e(self) -> int:
        return self.section.expanded_rank or expanded_rank(self.cfg.lora.r, self.section.sparsity)

    def budget(self, client: str, clients: Sequence[str]) -> int:
        budgets = self.section.budgets or [self.cfg.lora.r]
        rank = budgets[list(clients).index(client) % len(budgets)]
        if rank > self.rank_e:
            raise ValueError(f"perfit.budgets rank {rank} exceeds the expanded rank {self.rank_e}")
        return rank

    def lora_model(self, resources: Any) -> tuple[Any, Any]:
        """The base LM with one rank-r_e LoRA, shared by the clients of a process (states swap in)."""

        def build() -> tuple[Any, Any]:
            model, tokenizer = resources.model(self.client_model_spec(""))
            lora = self.cfg.lora
            targets = None if lora.target_modules == "auto" else lora.target_modules
            peft = attach_lora(
                model, r=self.rank_e, alpha=lora.alpha, dropout=lora.dropout, target_modules=targets
            )
            return peft, tokenizer

        pair: tuple[Any, Any] = resources.get("perfit/lora", build)
        return pair

    def module_shapes(self, resources: Any) -> dict[str, tuple[int, ...]]:
        model, _ = self.lora_model(resources)
        return {key: tuple(p.shape) for key, p in adapter_parameters(model).items()}

    # ----- client ----------------------------------------------------------------------------------
    def client_tasks(self) -> dict[str, ClientTask]:
        return {
            "search": self._search,
            "fit": self._fit,
            "update": self._update,
            PERSONAL_EVAL: self._evaluate_personal,
        }

    def _batches(self, ctx: ClientContext, seed: int) -> list[dict[str, torch.Tensor]]:
        _, tokenizer = self.lora_model(ctx.resources)
        examples = client_examples(ctx)
        return make_batches(examples, self.cfg.train.batch_size, int(tokenizer.pad_token_id or 0), seed=seed)

    def _search(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Alg. 1 on this client's data: its mask (sent as packed bits) and initial masked values."""
        model, _ = self.lora_model(ctx.resources)
        shapes = self.module_shapes(ctx.resources)
        section = self.section
        # One initial expanded LoRA for everyone (Alg. 2's input Delta theta_0), pruned per client: the
        # entries several clients keep start equal, so their parameter-wise mean is meaningful.
        weights = symmetric_init(shapes, derive_seed(self.cfg.seed, "perfit-init"))
        masks = {key: np.ones(shape, dtype=bool) for key, shape in shapes.items()}
        total, final = sum(m.size for m in masks.values()), kept_count(shapes, int(msg["budget"]))
        batches = self._batches(ctx, derive_seed(self.cfg.seed, "perfit-search", ctx.client_id))
        per_step = section.search_batches or len(batches)
        for step in range(1, section.search_steps + 1):
            start = (step - 1) * per_step
            chosen = [batches[(start + i) % len(batches)] for i in range(per_step)]
            grad, fisher = local_gradients(model, {k: w * masks[k] for k, w in weights.items()}, chosen)
            scores = {
                k: importance_scores(weights[k], grad[k], fisher[k], section.importance) for k in shapes
            }
            masks = top_entries(scores, masks, keep_schedule(total, final, step, section.search_steps))
        ctx.state["mask"] = {key: pack_mask(mask) for key, mask in masks.items()}
        ctx.state["values"] = gather_masked(weights, masks)
        reply: Payload = {MASK + key: pack_mask(mask) for key, mask in masks.items()}
        reply["num_examples"] = len(ctx.data)
        return reply

    def _own_masks(self, ctx: ClientContext) -> dict[str, np.ndarray]:
        if "mask" not in ctx.state:
            raise ValueError(f"client {ctx.client_id} has no PerFIT mask: it must search first")
        shapes = self.module_shapes(ctx.resources)
        return {key: unpack_mask(bits, shapes[key]) for key, bits in ctx.state["mask"].items()}

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Alg. 2's local step: train the masked LoRA from the client's own values, upload masked values."""
        model, tokenizer = self.lora_model(ctx.resources)
        masks = self._own_masks(ctx)
        load_adapter(model, scatter_masked(ctx.state["values"], masks))
        params = adapter_parameters(model)
        grad_masks = {key: torch.from_numpy(mask) for key, mask in masks.items()}
        result = train_selected(
            ctx,
            model,
            params,
            client_examples(ctx),
            pad_token_id=int(tokenizer.pad_token_id or 0),
            grad_masks=grad_masks,
        )
        values = gather_masked(adapter_arrays(model), masks)
        ctx.state["values"] = values
        reply: Payload = {VALUES + key: value for key, value in values.items()}
        reply.update(fit_scalars(ctx, result))
        return reply

    def _update(self, ctx: ClientContext, msg: Payload) -> Payload:
        """The personalised aggregate (Alg. 3): this client's masked entries of the masked mean."""
        masks = self._own_masks(ctx)
        values = arrays(msg, VALUES)
        for key, mask in masks.items():
            if values[key].shape != (int(mask.sum()),):
                raise ValueError(
                    f"update of {key}: {values[key].shape[0]} values for {int(mask.sum())} entries"
                )
        ctx.state["values"] = {key: np.asarray(value, dtype=np.float32) for key, value in values.items()}
        return {"received": len(values)}

    def _evaluate_personal(self, ctx: ClientContext, msg: Payload) -> Payload:
        model, tokenizer = self.lora_model(ctx.resources)
        shapes = self.module_shapes(ctx.resources)
        if "mask" in ctx.state:
            adapter = scatter_masked(ctx.state["values"], self._own_masks(ctx))
        else:  # never sampled: the base model
            adapter = {key: np.zeros(shape, dtype=np.float32) for key, shape in shapes.items()}
        if not ctx.eval_data:
            raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout)")
        load_adapter(model, adapter)
        rnd = int(msg["round"])
        result = evaluate_model(ctx.cfg, model, tokenizer, ctx.eval_data, rnd)
        return personal_reply(result, len(ctx.eval_data), rnd)

    # ----- server ----------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        self.shapes = self.module_shapes(server.resources)

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        clients = fed.client_ids()
        sampled = fed.sample(self.clients_per_round(fed), rnd)
        newcomers = [c for c in sampled if c not in self.masks]
        if newcomers:
            self._collect_masks(newcomers, clients, fed)
        ready = [c for c in sampled if c in self.masks]
        masks = {c: self.unpacked(c) for c in ready}
        expect = {c: self._fit_spec(masks[c], fed) for c in ready}
        message: Payload = {"round": rnd}
        replies = fed.call(ready, "fit", message, timeout=self.cfg.fed.client_timeout, expect=expect)
        self.require_replies(replies, sampled, fed.traffic)
        trained = list(replies)
        weights = [int(replies[c]["num_examples"]) for c in trained]
        if self.section.aggregate:
            states = [scatter_masked(arrays(replies[c], VALUES), masks[c]) for c in trained]
            mean, _ = masked_average(states, [masks[c] for c in trained], weights)
            personal: dict[str, Payload] = {}
            for client in trained:
                personal[client] = {VALUES + k: v for k, v in gather_masked(mean, masks[client]).items()}
            fed.call(trained, "update", personal, timeout=self.cfg.fed.client_timeout)
        kept = sum(int(m.sum()) for c in trained for m in masks[c].values()) / max(1, len(trained))
        return fit_round_result(sampled, {c: replies[c] for c in trained}, weights, {"kept_entries": kept})

    def _collect_masks(self, newcomers: list[str], clients: list[str], fed: Federation) -> None:
        """The search task of clients sampled for the first time; their masks, checked, are kept."""
        messages: dict[str, Payload] = {c: {"budget": self.budget(c, clients)} for c in newcomers}
        spec = ReplySpec(
            {
                MASK + k: ArraySpec(((int(np.prod(shape)) + 7) // 8,), "uint8")
                for k, shape in self.shapes.items()
            },
            {"num_examples": int},
            example_limits=fed.client_sizes,
        )
        replies = fed.call(newcomers, "search", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        for client, reply in replies.items():
            packed = arrays(reply, MASK)
            held = sum(int(unpack_mask(packed[k], shape).sum()) for k, shape in self.shapes.items())
            wanted = kept_count(self.shapes, self.budget(client, clients))
            if held != wanted:
                fed.traffic.rejected[client] = f"mask holds {held} entries, its budget is {wanted}"
                continue
            self.masks[client] = {key: np.asarray(value) for key, value in packed.items()}

    def unpacked(self, client: str) -> dict[str, np.ndarray]:
        return {key: unpack_mask(bits, self.shapes[key]) for key, bits in self.masks[client].items()}

    def _fit_spec(self, masks: Mapping[str, np.ndarray], fed: Federation) -> ReplySpec:
        arrays_spec = {VALUES + k: ArraySpec((int(m.sum()),), "float32") for k, m in masks.items()}
        return ReplySpec(
            arrays_spec, REPLY_SCALARS, norm_bound=self.cfg.fed.norm_bound, example_limits=fed.client_sizes
        )

    @classmethod
    def load_final(
        cls,
        cfg: ExperimentConfig,
        run_dir: Path,
        variant: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> FinalModel:
        """None to load: PerFIT's models are personal (a sparse adapter per client, kept by its client)."""
        raise FinalModelError(
            f"{run_dir} is a PerFIT run: each client holds its own personal adapter and the server keeps no "
            "global model, so there is no single final model to evaluate or generate from; the clients' "
            "scores on their own held-out data are the personal/* metrics in metrics.jsonl"
        )

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """PerFIT has no global model: its evaluation is the clients' own (``eval.personal``)."""
        return EvalResult({})

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        message: Payload = {"round": rnd}
        return message

    def state_dict(self) -> dict[str, Any]:
        return {"masks": self.masks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.masks = {c: {k: np.asarray(v) for k, v in m.items()} for c, m in state["masks"].items()}


def local_gradients(
    model: Any, weights: Mapping[str, np.ndarray], batches: Sequence[dict[str, torch.Tensor]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The LoRA weights' mean gradient of the response NLL over ``batches`` and the empirical Fisher
    diagonal (mean of the squared per-batch gradients), with ``weights`` loaded; the base is frozen."""
    load_adapter(model, weights)
    params = adapter_parameters(model)
    grad = {k: np.zeros(p.shape, dtype=np.float64) for k, p in params.items()}
    fisher = {k: np.zeros(p.shape, dtype=np.float64) for k, p in params.items()}
    device = next(iter(params.values())).device
    model.eval()  # no dropout: the scores measure the model as it is
    for batch in batches:
        model.zero_grad(set_to_none=True)
        nll, count = response_nll(model, {k: v.to(device) for k, v in batch.items()})
        (nll / max(1, count)).backward()
        for key, p in params.items():
            g = p.grad.detach().double().cpu().numpy() if p.grad is not None else 0.0
            grad[key] += g / len(batches)
            fisher[key] += np.square(g) / len(batches)
    model.zero_grad(set_to_none=True)
    return grad, fisher
