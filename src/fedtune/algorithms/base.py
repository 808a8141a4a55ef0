"""The Algorithm contract: one subclass per method, registered by name."""

from __future__ import annotations

import inspect
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from fedtune.algorithms.exporting import Exported, export_causal_lm, full_precision
from fedtune.algorithms.final import (
    FinalModel,
    FinalRun,
    check_options,
    check_variant,
    load_adapter_model,
    save_adapter_model,
)
from fedtune.algorithms.personal import personal_replies, personal_results
from fedtune.config import AlgorithmConfig, ExperimentConfig
from fedtune.data.records import Record
from fedtune.errors import RunError
from fedtune.eval.evaluate import EvalResult, EvalSet, evaluate_lm
from fedtune.fl.federation import ClientTask, Federation, ServerContext, Traffic
from fedtune.fl.payload import Payload
from fedtune.fl.privacy import ClientLevelDP
from fedtune.fl.release import Release, client_task_table
from fedtune.fl.secagg.server import SecureAggregation
from fedtune.models.spec import ModelSpec
from fedtune.resources import model_spec


class RoundFailed(RunError):
    """Too few clients replied for the round to count; the message says why each one is missing."""


@dataclass
class RoundResult:
    clients: list[str]
    train_loss: float | None
    num_examples: int
    tokens: int
    extra: dict[str, float] = field(default_factory=dict)
    trained_examples: int | None = None


SectionT = TypeVar("SectionT", bound=AlgorithmConfig)


class Algorithm(ABC, Generic[SectionT]):
    """A federated method: client tasks plus the server's side of each round.

    ``Config`` validates the method's own section ``cfg.<name>`` and declares the ``fed.mode``
    values it implements (``Config.modes``). Methods are found by name through the entry-point group
    ``fedtune.algorithms`` (``fedtune.plugins``).
    """

    name: ClassVar[str]
    Config: ClassVar[type[AlgorithmConfig]]
    resends_after_restart: ClassVar[tuple[str, ...]] = ()
    """Metric keys that legitimately grow in the first round after a resume: an algorithm whose clients
    cache what they received (FedBiOT's emulator) sends it again to clients restarted with the server."""

    update_task: ClassVar[str] = "fit"
    """The client task whose reply's arrays are the update ``aggregate`` combines (what secure
    aggregation keeps on the clients and sums masked)."""

    release: Release
    """Sampling, clipping, secure aggregation and DP (``fl.release``): what ``sample_clients``,
    ``aggregate`` and ``all_client_tasks`` do beyond the method's own tasks."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.release = Release.from_config(cfg, self.update_task)

    @property
    def privacy(self) -> ClientLevelDP | None:
        """The run's client-level DP mechanism (``dp.enabled``): the runner starts and checkpoints it."""
        return self.release.privacy

    @property
    def secure(self) -> SecureAggregation | None:
        """The run's secure aggregation (``secagg.enabled``): the runner wraps the federation with it."""
        return self.release.secure

    @property
    def section(self) -> SectionT:
        """This algorithm's own config section (``cfg.<name>``)."""
        section: SectionT = self.cfg.section(self.name)
        return section

    @classmethod
    @abstractmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        """Task name -> client task, from the config alone: what a client runs needs no server (a task
        reads the run's config as ``ctx.cfg``)."""

    @classmethod
    def client_table(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        """``client_tasks(cfg)`` as the clients run them (``client_task_table``), built without
        constructing the algorithm: what a SuperNode or a Ray actor serves."""
        if not isinstance(inspect.getattr_static(cls, "client_tasks"), classmethod):
            raise TypeError(
                f"algorithm {cls.name!r}: client_tasks must be a classmethod, client_tasks(cls, cfg)"
            )
        return client_task_table(cfg, cls.update_task, cls.client_tasks(cfg))

    def all_client_tasks(self) -> dict[str, ClientTask]:
        """This run's client task table (``client_table``)."""
        return self.client_table(self.cfg)

    @abstractmethod
    def setup(self, server: ServerContext) -> None: ...

    @abstractmethod
    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult: ...

    @abstractmethod
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """The round's evaluation on ``eval_set`` (the primary test set, then each extra one)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def server_model_spec(self) -> ModelSpec:
        """The server's own model (the run's ``model:`` unless the method's server holds another,
        e.g. FedMKT's LLM over client SLMs)."""
        return model_spec(self.cfg.model, self.cfg.seed)

    def client_model_spec(self, client: str) -> ModelSpec:
        """The model ``client`` uses: the run's ``model:`` unless the method gives clients their own
        (heterogeneous architectures and tokenizers). Loaded once per distinct spec per process."""
        return model_spec(self.cfg.model, self.cfg.seed)

    def personal_messages(self, rnd: int, clients: list[str]) -> Payload | Mapping[str, Payload]:
        """What each client needs for its client-side evaluation (``eval.personal``), e.g. the global
        model for a method whose clients keep none; algorithms with ``Config.personal_eval`` override it
        and provide the client task ``evaluate_personal``."""
        raise NotImplementedError(f"algorithm {self.name!r} has no client-side evaluation")

    def evaluate_clients(self, rnd: int, server: ServerContext, fed: Federation) -> EvalResult:
        """Client-side evaluation: every client evaluates its own model on its own held-out split and
        replies with its metrics and held-out size; the server averages them (plain and weighted)."""
        return personal_results(self.personal_replies(rnd, fed))

    def personal_replies(self, rnd: int, fed: Federation) -> dict[str, Payload]:
        """Every client's reply to ``evaluate_personal`` (its metrics and held-out size), each checked."""
        return personal_replies(self.cfg, fed, self.personal_messages(rnd, fed.client_ids()))

    # ----- the final model: what `fedtune eval` / `generate` load from a finished run ---------------
    final_variants: ClassVar[tuple[str, ...]] = ()
    """Named variants of the final model (``--variant``); the first is the default."""
    final_options: ClassVar[tuple[str, ...]] = ()
    """Keys ``load_final`` takes as ``--option KEY=VALUE``."""

    def final_adapter(self) -> Mapping[str, np.ndarray] | None:
        """The final LoRA adapter on the run's ``model:`` (saved as a standard peft directory, so the
        default ``load_final`` serves it), or ``None`` when the final model is something else."""
        return None

    def write_artifacts(self, directory: Path) -> None:
        """Write what the final model needs beyond ``final_adapter`` (called once, at the end)."""
        return None

    def save_final(self, server: ServerContext, directory: Path) -> None:
        """The run's final artifacts in ``directory``: the adapter, then the method's own files."""
        directory.mkdir(parents=True, exist_ok=True)
        adapter = self.final_adapter()
        if adapter is not None:
            save_adapter_model(self.cfg, server.resources, adapter, directory)
        self.write_artifacts(directory)

    @classmethod
    def load_final(
        cls,
        cfg: ExperimentConfig,
        run_dir: Path,
        variant: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> FinalModel:
        """A finished run's final model: ``variant`` and ``options`` checked against the method's
        ``final_variants`` / ``final_options``, then ``final_model``."""
        options = dict(options or {})
        check_options(cls.name, cls.final_options, options)
        return cls.final_model(
            FinalRun(cfg, run_dir, check_variant(cls.name, cls.final_variants, variant), options)
        )

    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        """The final model (the default: ``final_adapter`` on the run's ``model:``); a method whose
        final model is something else overrides this."""
        return load_adapter_model(run.cfg, run.run_dir)

    export_formats: ClassVar[tuple[str, ...]] = ("peft", "merged", "gguf")
    """What ``fedtune export`` can write of the final model: ``peft`` (the LoRA adapter as a peft
    directory), ``merged`` (a transformers model directory) and ``gguf`` (converted from ``merged``)."""

    @classmethod
    def export_final(cls, run: FinalRun, fmt: str, out: Path) -> Exported:
        """Write the final model to ``out`` as ``fmt`` (``peft`` or ``merged``) and say what was written.

        The default exports ``final_model`` when it is a causal LM (with the base model loaded
        unquantised); a method whose final model is something else overrides this to write the part
        that stands on its own (and says so), or refuses with ``ExportError``."""
        return export_causal_lm(cls.final_model(full_precision(run)), fmt, out, "the final model")

    def aggregate(
        self,
        states: Sequence[Mapping[str, np.ndarray]],
        weights: Sequence[float],
        reference: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The clients' tensors combined by ``fed.aggregator``: the weighted mean, or a robust rule.

        ``reference`` is the state the clients started from (what the server sent). Under ``dp`` it is
        required: the result is then ``reference`` moved by the noised sum of the clients' clipped
        updates over the expected count, unweighted (``fl.privacy``), and the round is accounted.
        Under ``secagg`` ``states`` are empty (the updates stayed on the clients): the result is
        ``reference`` moved by the round's secure sum (weighted by example count, or noised under ``dp``).
        See ``fl.release.Release.aggregate``."""
        return self.release.aggregate(states, weights, reference)

    def sample_clients(self, fed: Federation, rnd: int) -> list[str]:
        """Round ``rnd``'s clients: ``clients_per_round`` seeded by the run's seed, or under ``dp`` drawn
        from the run's secret (Poisson with rate q, or ``fixed``) so that who took part stays hidden."""
        return self.release.sample(fed, rnd)

    def clients_per_round(self, fed: Federation) -> int:
        return self.release.per_round(fed)

    def require_replies(
        self, replies: Mapping[str, Payload], sampled: list[str], traffic: Traffic | None = None
    ) -> None:
        needed = min(self.cfg.fed.min_replies, len(sampled))
        # A lone client that secure aggregation left out did reply: the round aggregates nothing (under
        # dp the model moves by the noise alone, as a Poisson round that samples nobody does).
        if len(replies) + self.release.withheld() < needed:
            raise RoundFailed(missing_replies_message(len(replies), sampled, needed, traffic))


def missing_replies_message(got: int, sampled: list[str], needed: int, traffic: Traffic | None) -> str:
    """Why a round has too few replies: each missing client's reason, and the config keys that matter."""
    lines = [f"round failed: {got} of {len(sampled)} sampled clients replied; fed.min_replies = {needed}"]
    keys = {"fed.min_replies"}
    if traffic is not None:
        for client in sampled:
            reason = traffic.rejected.get(client) or traffic.failed.get(client)
            if reason is None:
                continue
            lines.append(f"  {client}: {'rejected: ' if client in traffic.rejected else ''}{reason}")
            if "update norm" in reason:
                keys.add("fed.norm_bound")
            if reason.startswith("late"):
                keys.add("fed.client_timeout")
            if "num_examples" in reason:
                keys.add("flower.client_data")
            if reason.startswith("secure aggregation"):
                keys.update(("secagg.threshold", "fed.client_timeout"))
    lines.append(f"to change: {', '.join(sorted(keys))}")
    return "\n".join(lines)


def evaluate_model(
    cfg: ExperimentConfig, model: Any, tokenizer: Any, records: list[Record], rnd: int
) -> EvalResult:
    """``model`` evaluated on ``records`` with the run's eval settings, sampling seeded by the round."""
    return evaluate_lm(
        model,
        tokenizer,
        records,
        cfg.eval,
        template=cfg.data.template,
        max_length=cfg.data.max_length,
        seed=derive_seed(cfg.seed, rnd, "eval"),
    )


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 31-bit seed that is a pure function of the run seed and e.g. (round, client id)."""
    words = [seed] + [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1)[0] & 0x7FFFFFFF)
