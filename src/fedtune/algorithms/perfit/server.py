"""PerFIT's server: it collects each client's mask once, runs the rounds (Alg. 2's training, Alg. 3's
masked mean sent back per client) and keeps only the masks; it holds no model of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import PERSONAL_EVAL, Algorithm, RoundResult
from fedtune.algorithms.final import FinalModel, FinalModelError
from fedtune.algorithms.perfit import client
from fedtune.algorithms.perfit.config import PerFITConfig
from fedtune.algorithms.perfit.maths import budget_rank, kept_count
from fedtune.algorithms.perfit.wire import MASK, VALUES, fit_spec, search_spec, values_payload
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import gather_masked, masked_average, scatter_masked, unpack_mask
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

    def client_tasks(self) -> dict[str, ClientTask]:
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
        expect = {c: fit_spec(masks[c], self.cfg.fed.norm_bound, fed.client_sizes) for c in ready}
        message: Payload = {"round": rnd}
        replies = fed.call(ready, "fit", message, timeout=self.cfg.fed.client_timeout, expect=expect)
        self.require_replies(replies, sampled, fed.traffic)
        trained = list(replies)
        weights = [int(replies[c]["num_examples"]) for c in trained]
        if self.section.aggregate:
            self._send_masked_mean(trained, {c: replies[c] for c in trained}, masks, weights, fed)
        kept = sum(int(m.sum()) for c in trained for m in masks[c].values()) / max(1, len(trained))
        return fit_round_result(sampled, {c: replies[c] for c in trained}, weights, {"kept_entries": kept})

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
        mean, _ = masked_average(states, [masks[c] for c in trained], weights)
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

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        message: Payload = {"round": rnd}
        return message

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

    def state_dict(self) -> dict[str, Any]:
        return {"masks": self.masks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.masks = {c: {k: np.asarray(v) for k, v in m.items()} for c, m in state["masks"].items()}
