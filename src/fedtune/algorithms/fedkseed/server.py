"""FedKSeed's rounds: send the seeds and what each client lacks of the history, check the K scalars
that come back, append their per-seed mean to the history. The history is the whole state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, evaluate_model
from fedtune.algorithms.fedkseed.client import MODEL, fit, process_replica, tuned_lm
from fedtune.algorithms.fedkseed.config import FedKSeedConfig
from fedtune.algorithms.fedkseed.maths import (
    candidate_seeds,
    foreign_seed,
    history_is_cheaper,
    seed_probabilities,
)
from fedtune.algorithms.final import FinalModel, FinalModelError, FinalRun
from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.config import ExperimentConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ReplySpec
from fedtune.models.loading import resolve_device, resolve_dtype

HISTORY_FILE = "fedkseed-history.npz"
"""The final model's artifact: the seeds, the history and the step size (the base model replays it)."""


def reply_spec(seeds: np.ndarray, norm_bound: float | None, client_sizes: Mapping[str, int]) -> ReplySpec:
    """A valid reply: the round's ``seeds`` ``[K]`` int64 and exactly K finite float64 ``scalars`` (their
    norm, the update's, within ``norm_bound``), and the statistics of every fit reply. The update is the
    scalars alone: the seeds are ids, checked for equality (``maths.foreign_seed``), not measured."""
    like = ReplySpec.like({"seeds": seeds, "scalars": np.zeros(len(seeds))}, scalars=REPLY_SCALARS)
    return replace(
        like,
        norm_bound=norm_bound,
        reference={"scalars": np.zeros(len(seeds))},
        example_limits=dict(client_sizes),
    )


class FedKSeed(Algorithm[FedKSeedConfig]):
    name = "fedkseed"
    Config = FedKSeedConfig
    resends_after_restart = ("bytes_down",)
    """A restarted server knows no client's version: its first round sends each the whole history."""
    export_formats: ClassVar[tuple[str, ...]] = ("merged", "gguf")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.seeds = np.zeros(0, dtype=np.int64)
        self.history = np.zeros((0, 0), dtype=np.float64)
        self.known: dict[str, int] = {}
        """Client -> the version it confirmed by a valid reply (not checkpointed: after a restart, none)."""

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": fit}

    def setup(self, server: ServerContext) -> None:
        self.seeds = candidate_seeds(self.cfg.seed, self.section.num_seeds)
        self.history = np.zeros((0, len(self.seeds)), dtype=np.float64)
        # The directions z(seed) depend on the device's generator and the model's dtype: the final model
        # is replayed where they were drawn (``final_model``).
        first = next(tuned_lm(server.resources)[0].parameters())
        self.drawn = (first.device.type, str(first.dtype).removeprefix("torch."))

    # ----- a round ---------------------------------------------------------------------------------
    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        sampled = self.sample_clients(fed, rnd)
        messages = {client: self.message(client, server) for client in sampled}
        reference = {"seeds": self.seeds, "scalars": np.zeros(len(self.seeds))}
        spec = reply_spec(self.seeds, self.cfg.fed.norm_bound, fed.client_sizes)
        replies = fed.call(sampled, "fit", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        replies = self.drop_foreign_seeds(replies, fed)
        for client in sampled:
            if client in replies:
                self.known[client] = len(self.history)
            else:
                self.known.pop(client, None)
        self.require_replies(replies, sampled, fed.traffic)
        weights = [int(reply["num_examples"]) for reply in replies.values()]
        # Under secagg the clients kept both arrays (the seeds' update is 0) and the replies hold none:
        # the round's masked sum is moved onto a reference that names both.
        keys = ("scalars", "seeds") if self.secure is not None else ("scalars",)
        states = (
            []
            if self.secure is not None
            else [{"scalars": np.asarray(reply["scalars"])} for reply in replies.values()]
        )
        mean = self.aggregate(states, weights, reference={key: reference[key] for key in keys})
        row = np.asarray(mean["scalars"], dtype=np.float64)
        self.history = np.concatenate([self.history, row[None, :]])
        return fit_round_result(sampled, replies, weights)

    def message(self, client: str, server: ServerContext) -> Payload:
        """What ``client`` needs this round: the seeds, the reference scalars (zeros), the seed
        probabilities under importance sampling, and the history since its version, or the model when
        that costs fewer bytes."""
        since = self.known.get(client, 0)
        message: Payload = {
            "seeds": self.seeds,
            "scalars": np.zeros(len(self.seeds)),
            "history_from": since,
            "history": self.history[since:],
        }
        if self.section.sampling == "importance":
            message["probs"] = seed_probabilities(self.history, self.section.importance_alpha)
        replica = process_replica(server.resources, self.seeds, self.section.lr)
        if since < len(self.history) and not history_is_cheaper(
            len(self.history) - since, len(self.seeds), replica.num_bytes()
        ):
            replica.catch_up(0, self.history)
            message.update({MODEL + name: value for name, value in replica.arrays().items()})
            message.update({"history_from": len(self.history), "history": self.history[:0]})
        return message

    def drop_foreign_seeds(self, replies: Mapping[str, Payload], fed: Federation) -> dict[str, Payload]:
        """``replies`` without those whose seeds are not this round's (each rejected with the reason).
        Under secagg a reply carries no arrays: its seeds stayed on the client with its update."""
        kept = {}
        for client, reply in replies.items():
            returned = reply.get("seeds")
            problem = foreign_seed(returned, self.seeds) if isinstance(returned, np.ndarray) else None
            if problem is not None:
                fed.traffic.rejected[client] = f"fedkseed: {problem}"
                continue
            kept[client] = reply
        return kept

    # ----- evaluation and the final model ----------------------------------------------------------
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        replica = process_replica(server.resources, self.seeds, self.section.lr)
        replica.catch_up(0, self.history)
        model, tokenizer = tuned_lm(server.resources)
        return evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)

    def write_artifacts(self, directory: Path) -> None:
        np.savez(
            directory / HISTORY_FILE,
            seeds=self.seeds,
            history=self.history,
            lr=np.float64(self.section.lr),
            drawn_on=np.array(self.drawn),
        )

    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        """The run's base model with the saved history replayed on it."""
        from fedtune.algorithms.fedkseed.replica import SeedReplica
        from fedtune.algorithms.final import CausalLMModel, load_base_model

        path = run.run_dir / "artifacts" / HISTORY_FILE
        if not path.is_file():
            raise FinalModelError(f"{path} is missing: did the run finish? (`fedtune resume {run.run_dir}`)")
        saved = np.load(path)
        cfg = run.cfg
        if "drawn_on" in saved.files:  # (runs that predate it replay where they are loaded)
            device, dtype = drawn_on(path, tuple(str(v) for v in saved["drawn_on"]))
            cfg = cfg.model_copy(
                update={"model": cfg.model.model_copy(update={"device": device, "dtype": dtype})}
            )
        model, tokenizer = load_base_model(cfg)
        replica = SeedReplica(dict(model.named_parameters()), saved["seeds"], float(saved["lr"]))
        replica.catch_up(0, saved["history"])
        if cfg is not run.cfg:  # e.g. drawn in fp32 on the CPU, served in bf16 on a GPU: cast it now
            here = resolve_device(run.cfg.model.device)
            model.to(device=here, dtype=resolve_dtype(run.cfg.model.dtype, here))
        return CausalLMModel(run.cfg, model.eval(), tokenizer)

    # ----- the state: the seeds and the history ---------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        last = self.history[-1] if len(self.history) else np.zeros(len(self.seeds))
        return {"seeds": self.seeds, "history": self.history, "released": {"scalars": last}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seeds = np.asarray(state["seeds"], dtype=np.int64)
        self.history = np.asarray(state["history"], dtype=np.float64).reshape(-1, len(self.seeds))


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""torch's dtype names -> ``model.dtype``'s."""


def drawn_on(path: Path, drawn: tuple[str, ...]) -> tuple[str, str]:
    """The ``model.device`` and ``model.dtype`` the run drew its directions on (the server's model:
    ``setup``), where the history must be replayed to give the model the run trained: the CPU's and
    CUDA's generators give other numbers for the same seed, and a direction drawn in bf16 is not one
    drawn in fp32; the base model is loaded in that dtype too, not rounded through another."""
    if len(drawn) != 2 or drawn[0] not in ("cpu", "cuda") or drawn[1] not in DTYPE_NAMES:
        raise FinalModelError(f"{path}: drawn_on {list(drawn)} is no device (cpu, cuda) and dtype")
    device, dtype = drawn
    if device == "cuda" and not torch.cuda.is_available():
        raise FinalModelError(
            f"{path}: this run drew its random directions on a CUDA GPU, whose generator the CPU cannot "
            "reproduce; load its final model on a machine with a CUDA GPU"
        )
    return device, DTYPE_NAMES[dtype]
