"""PerFIT's server: it collects every client's mask once, before round 1, and keeps the dense expanded
module G (``perfit.start: global``, the paper): each round it sends every sampled client G at its mask
and updates G on the entries the round's clients hold (Alg. 3). With ``start: own`` (an ablation) it
keeps only the masks and sends each trained client Alg. 3's mean at its entries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fedtune.algorithms.perfit.client as client
from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed
from fedtune.algorithms.exporting import Exported, export_causal_lm, full_precision
from fedtune.algorithms.final import FinalModel, FinalRun
from fedtune.algorithms.perfit.config import PerFITConfig
from fedtune.algorithms.perfit.final import CLIENT_OPTION, personal_model
from fedtune.algorithms.perfit.maths import (
    budget_rank,
    kept_count,
    masked_aggregate,
    symmetric_init,
    thinly_held_share,
    update_global,
)
from fedtune.algorithms.perfit.wire import AFTER_FIT, MASK, VALUES, fit_spec, search_spec, values_payload
from fedtune.algorithms.personal import EVAL_EXAMPLES, PERSONAL_EVAL, personal_results
from fedtune.config import ConfigError, ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import gather_masked, scatter_masked, unpack_mask
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.resources import Resources


class PerFIT(Algorithm[PerFITConfig]):
    name = "perfit"
    Config = PerFITConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.masks: dict[str, dict[str, np.ndarray]] = {}
        """client -> module key -> packed mask bits (what each client sent once)."""
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.global_module: dict[str, np.ndarray] = {}
        """G, the dense expanded module (``start: global``); empty with ``start: own``."""

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {
            "search": client.search,
            "fit": client.fit,
            "update": client.update,
            PERSONAL_EVAL: client.evaluate_personal,
        }

    @property
    def rank_e(self) -> int:
        """The expanded rank r_e of every client's LoRA."""
        return client.search_rank(self.cfg)

    def budget(self, client_id: str, clients: Sequence[str]) -> int:
        """``client_id``'s budget (a rank): ``perfit.budgets`` round-robin over the clients in order."""
        budgets = self.section.budgets or [self.cfg.lora.r]
        return budget_rank(budgets, list(clients).index(client_id), self.rank_e)

    def module_shapes(self, resources: Resources) -> dict[str, tuple[int, ...]]:
        """The clients' expanded LoRA keys and shapes: what masks and values are laid out by."""
        return client.module_shapes(self.cfg, resources)

    @property
    def starts_global(self) -> bool:
        return bool(self.section.start == "global")

    def setup(self, server: ServerContext) -> None:
        if self.cfg.fed.aggregator == "trimmed_mean":
            raise ConfigError(
                "fed.aggregator: trimmed_mean does not fit PerFIT: each entry is averaged over its own "
                "holders, often too few to trim; use median (per entry, over its holders) or mean"
            )
        self.shapes = self.module_shapes(server.resources)
        if self.starts_global:
            # The same symmetric init every client searched with (Alg. 2's Delta theta_0).
            self.global_module = symmetric_init(self.shapes, derive_seed(self.cfg.seed, "perfit-init"))

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        clients = fed.client_ids()
        sampled = self.sample_clients(fed, rnd)
        # The paper: every client searches before round 1; the ablation: when first sampled.
        searching = [c for c in (clients if self.starts_global else sampled) if c not in self.masks]
        if searching:
            self._collect_masks(searching, clients, fed)
        ready = [c for c in sampled if c in self.masks]
        masks = {c: self.unpacked(c) for c in ready}
        messages = {c: self._start_message(rnd, c, masks[c]) for c in ready}
        bound, sizes = self.cfg.fed.norm_bound, fed.client_sizes
        expect = {c: fit_spec(masks[c], bound, sizes, arrays(messages[c], VALUES) or None) for c in ready}
        replies = fed.call(ready, "fit", messages, timeout=self.cfg.fed.client_timeout, expect=expect)
        self.require_replies(replies, sampled, fed.traffic)
        trained = list(replies)
        weights = [int(replies[c]["num_examples"]) for c in trained]
        if self.starts_global:
            states = [scatter_masked(arrays(replies[c], VALUES), masks[c]) for c in trained]
            median = self.cfg.fed.aggregator == "median"
            held = [masks[c] for c in trained]
            self.global_module = update_global(self.global_module, states, held, weights, median)
        elif self.section.aggregate:
            self._send_masked_mean(trained, {c: replies[c] for c in trained}, masks, weights, fed)
        kept = sum(int(m.sum()) for c in trained for m in masks[c].values()) / max(1, len(trained))
        extra = {"kept_entries": kept}
        if self.cfg.fed.aggregator == "median":  # the row says how much of the median one liar can move
            extra["median_unprotected"] = thinly_held_share([masks[c] for c in trained])
        return fit_round_result(sampled, {c: replies[c] for c in trained}, weights, extra)

    def _send_masked_mean(
        self,
        trained: list[str],
        replies: Mapping[str, Payload],
        masks: Mapping[str, Mapping[str, np.ndarray]],
        weights: list[int],
        fed: Federation,
    ) -> None:
        """Alg. 3: every entry's example-weighted mean over the clients holding it; each trained client
        receives the mean at its own entries."""
        states = [scatter_masked(arrays(replies[c], VALUES), masks[c]) for c in trained]
        held = [masks[c] for c in trained]
        mean, _ = masked_aggregate(states, held, weights, self.cfg.fed.aggregator == "median")
        personal = {c: values_payload(gather_masked(mean, masks[c])) for c in trained}
        fed.call(trained, "update", personal, timeout=self.cfg.fed.client_timeout)

    def _collect_masks(self, newcomers: list[str], clients: list[str], fed: Federation) -> None:
        """The search task of clients sampled for the first time; their masks, checked, are kept."""
        messages: dict[str, Payload] = {c: {"budget": self.budget(c, clients)} for c in newcomers}
        spec = search_spec(self.shapes, fed.client_sizes)
        replies = fed.call(newcomers, "search", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        for client_id, reply in replies.items():
            packed = arrays(reply, MASK)
            held = sum(int(unpack_mask(packed[k], shape).sum()) for k, shape in self.shapes.items())
            wanted = kept_count(self.shapes, self.budget(client_id, clients))
            if held != wanted:
                fed.traffic.rejected[client_id] = f"mask holds {held} entries, its budget is {wanted}"
                continue
            self.masks[client_id] = {key: np.asarray(value) for key, value in packed.items()}

    def unpacked(self, client_id: str) -> dict[str, np.ndarray]:
        return {key: unpack_mask(bits, self.shapes[key]) for key, bits in self.masks[client_id].items()}

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """PerFIT has no global model: its evaluation is the clients' own (``eval.personal``)."""
        return EvalResult({})

    def _start_message(self, rnd: int, client_id: str, mask: Mapping[str, np.ndarray]) -> Payload:
        """What ``client_id`` starts from: G at its mask (``start: global``); nothing (``own``)."""
        message: Payload = {"round": rnd}
        if self.starts_global:
            message.update(values_payload(gather_masked(self.global_module, mask)))
        return message

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        """Every client with a mask is scored on G at its mask (``start: global``)."""
        messages: dict[str, Payload] = {}
        for client_id in clients:
            has_mask = client_id in self.masks
            messages[client_id] = (
                self._start_message(rnd, client_id, self.unpacked(client_id)) if has_mask else {"round": rnd}
            )
        return messages

    def evaluate_clients(self, rnd: int, server: ServerContext, fed: Federation) -> EvalResult:
        """``personal/``: every client's personalised model G at its mask on its own held-out data;
        ``personal_after_fit/``: the clients that trained this round, scored on what they trained (the
        paper does not say which of the two it reports)."""
        replies = self.personal_replies(rnd, fed)
        result = personal_results(replies)
        after = {c: after_fit(r) for c, r in replies.items() if any(k.startswith(AFTER_FIT) for k in r)}
        if after:
            result.metrics.update(personal_results(after, prefix="personal_after_fit/").metrics)
        return result

    final_options = (CLIENT_OPTION,)

    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        """One client's personalised model (``--option client=ID``): PerFIT has no global one."""
        return personal_model(run)

    @classmethod
    def export_final(cls, run: FinalRun, fmt: str, out: Path) -> Exported:
        """One client's personalised model (``--option client=ID``): the expanded LoRA at G on its mask."""
        client = run.options.get(CLIENT_OPTION)
        return export_causal_lm(
            cls.final_model(full_precision(run)), fmt, out, f"PerFIT client {client}'s personalised model"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"masks": self.masks, "global_module": self.global_module}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.masks = {c: {k: np.asarray(v) for k, v in m.items()} for c, m in state["masks"].items()}
        self.global_module = {k: np.asarray(v) for k, v in state.get("global_module", {}).items()}


def after_fit(reply: Payload) -> Payload:
    """A client's ``after_fit/`` metrics as a plain ``evaluate_personal`` reply."""
    found: Payload = {k[len(AFTER_FIT) :]: v for k, v in reply.items() if k.startswith(AFTER_FIT)}
    found[EVAL_EXAMPLES] = reply[EVAL_EXAMPLES]
    return found
