"""P4: simulation overhead per client per round (everything but forward/backward), and memory.

``ours``: the real FedIT round (``FedIT.run_round`` through ``InProcessFederation``) with local
training replaced by a no-op, so what is timed is exactly the rest of the FedIT client (load the
received adapter into the shared model, read it back out as arrays, build the reply) and of the
server (broadcast payload, payload bytes, ``ReplySpec.like`` validation, weighted aggregation,
server step). ``yardstick``: OpenFedLLM-style, one model whose full state dict is swapped per
client (``model.load_state_dict(full_state)`` + ``copy.deepcopy(model.state_dict())``), the
adapter keys kept and averaged as OpenFedLLM does. The two alternate round by round; the first
round of each is warm-up (it also tokenizes every client's data once) and is not timed.

Memory: FedIT in standalone mode, where each of the clients keeps its own adapter in
``ctx.state`` (as personalised methods do), measured first, before any other phase has grown the
heap: RSS after the clients hold their adapters vs base-model RSS + clients x adapter
bytes + 1 GB. For the yardstick's personalised variant (a full state dict per client) the
per-client growth is measured on a few clients and extrapolated.
"""

from __future__ import annotations

import copy
import gc
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    base_parser,
    markdown_table,
    median,
    parse,
    peak_rss_mb,
    rss_mb,
    write_results,
)

MB = 2**20
GB = 2**30


def _no_training(model: Any, examples: Sequence[Any], train: Any, **kwargs: Any) -> Any:
    """Stands in for ``local_sft``: the forward/backward work is what P4 leaves out."""
    from fedtune.train.loop import TrainResult

    return TrainResult(
        loss=0.0, steps=0, num_examples=len(examples), tokens=0, target_tokens=0, seconds=0.0, peak_mem_mb=0.0
    )


def _config(model_name: str, num_clients: int, mode: str) -> Any:
    from fedtune.config import ExperimentConfig

    return ExperimentConfig.model_validate(
        {
            "name": "p4",
            "progress": False,
            "model": {"name": model_name, "dtype": "fp32", "device": "cpu"},
            "data": {"partition": {"num_clients": num_clients}},
            "fed": {"mode": mode, "rounds": 1000},
        }
    )


class Simulation:
    """One FedIT job (real server round, real client task minus training) over a shared model."""

    def __init__(self, cfg: Any, resources: Any, client_data: Mapping[str, list[Any]], workdir: Path) -> None:
        from fedtune.algorithms.fedit import FedIT
        from fedtune.fl.federation import ServerContext
        from fedtune.fl.simulation import InProcessFederation

        self.algorithm = FedIT(cfg)
        self.server = ServerContext(cfg, resources, eval_records=[], public_records=[], run_dir=workdir)
        self.fed = InProcessFederation(cfg, FedIT.client_tasks(cfg), client_data, resources, workdir)
        self.algorithm.setup(self.server)
        self.rnd = 0

    def round(self) -> float:
        self.rnd += 1
        start = time.perf_counter()
        self.fed.begin_round(self.rnd)
        result = self.algorithm.run_round(self.rnd, self.server, self.fed)
        seconds = time.perf_counter() - start
        if len(result.clients) != len(self.fed.client_ids()) or self.fed.traffic.failed:
            raise RuntimeError(f"round {self.rnd}: failed clients {self.fed.traffic.failed}")
        if self.fed.traffic.rejected:
            raise RuntimeError(f"round {self.rnd}: rejected replies {self.fed.traffic.rejected}")
        return seconds


class FullStateSwap:
    """OpenFedLLM-style simulation: one model, the full state dict loaded and deep-copied per client."""

    def __init__(self, model: Any, sizes: Mapping[str, int]) -> None:
        self.model = model
        self.sizes = dict(sizes)
        self.global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.adapter_keys = [k for k in self.global_state if "lora_" in k]

    def client(self) -> dict[str, Any]:
        self.model.load_state_dict(self.global_state)
        # Local training would run here.
        return copy.deepcopy(self.model.state_dict())

    def round(self) -> float:
        start = time.perf_counter()
        local: dict[str, dict[str, Any]] = {}
        for cid in self.sizes:
            full = self.client()
            local[cid] = {k: full[k] for k in self.adapter_keys}
            del full
        total = sum(self.sizes.values())
        for key in self.adapter_keys:
            self.global_state[key] = sum(local[c][key] * (self.sizes[c] / total) for c in self.sizes)
        return time.perf_counter() - start


def _per_call_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * median(times)


def breakdown(model: Any, adapter: Mapping[str, Any], num_clients: int, repeats: int) -> dict[str, float]:
    """Milliseconds of each piece of the per-client path, timed alone (context for the totals)."""
    from fedtune.algorithms.adapters import ADAPTER
    from fedtune.algorithms.local import REPLY_SCALARS
    from fedtune.fl.aggregate import weighted_average
    from fedtune.fl.payload import payload_nbytes
    from fedtune.fl.validation import ReplySpec, validate_reply
    from fedtune.models.lora import adapter_arrays, load_adapter

    reply: dict[str, Any] = {ADAPTER + k: v for k, v in adapter.items()}
    reply.update(num_examples=8, trained_examples=8, train_loss=0.0, tokens=0, peak_mem_mb=0.0)
    spec = ReplySpec.like({ADAPTER + k: v for k, v in adapter.items()}, scalars=REPLY_SCALARS)
    spec_no_reference = ReplySpec.like(
        {ADAPTER + k: v for k, v in adapter.items()}, scalars=REPLY_SCALARS, reference=False
    )
    states = [dict(adapter) for _ in range(num_clients)]
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    few = max(3, repeats // 4)
    return {
        "load_adapter": _per_call_ms(lambda: load_adapter(model, adapter), repeats),
        "adapter_arrays": _per_call_ms(lambda: adapter_arrays(model), repeats),
        "payload_nbytes": _per_call_ms(lambda: payload_nbytes(reply), repeats),
        "validate_reply": _per_call_ms(lambda: validate_reply(reply, spec), repeats),
        "validate_reply_without_reference": _per_call_ms(
            lambda: validate_reply(reply, spec_no_reference), repeats
        ),
        "weighted_average_per_client": _per_call_ms(
            lambda: weighted_average(states, [1.0] * num_clients), few
        )
        / num_clients,
        "yardstick_load_state_dict": _per_call_ms(lambda: model.load_state_dict(full), few),
        "yardstick_deepcopy_state_dict": _per_call_ms(lambda: copy.deepcopy(model.state_dict()), few),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P4", model=True)
    parser.add_argument("--clients", type=int, default=None, help="clients per round (default 100; 10 smoke)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per side (default 3; 1 smoke)")
    parser.add_argument(
        "--yardstick-rss-clients",
        type=int,
        default=3,
        help="clients whose full state is kept to measure growth",
    )
    args, began = parse(parser, argv)
    num_clients = args.clients or (10 if args.smoke else 100)
    rounds = args.rounds or (1 if args.smoke else 3)

    import fedtune.algorithms.local as local_training
    from fedtune.data.builtin import load_builtin
    from fedtune.fl.checkpoint import save_checkpoint
    from fedtune.resources import Resources

    real_local_sft = local_training.local_sft
    local_training.local_sft = _no_training
    try:
        records = load_builtin("wordnet-instruct", "train")
        # Eight examples per client: enough for a realistic reply, cheap to tokenize in the warm-up round.
        client_data = {f"c{i:03d}": records[8 * i : 8 * i + 8] for i in range(num_clients)}
        sizes = {cid: len(data) for cid, data in client_data.items()}

        resources = Resources(_config(args.model, num_clients, "federated"))
        model, _ = resources.lora_lm()
        adapter = resources.initial_adapter()
        adapter_bytes = sum(int(v.nbytes) for v in adapter.values())
        full_state_bytes = sum(int(v.numel() * v.element_size()) for v in model.state_dict().values())
        gc.collect()
        base_rss = rss_mb()

        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            # Memory first, while nothing else has grown the heap: personalised adapters.
            standalone_cfg = _config(args.model, num_clients, "standalone")
            standalone = Simulation(standalone_cfg, resources, client_data, workdir)
            standalone_seconds = [standalone.round(), standalone.round()]
            gc.collect()
            held = sum(1 for s in standalone.fed.states.values() if "adapter" in s)
            rss_after = rss_mb()
            peak_after = peak_rss_mb()
            budget = base_rss + (num_clients * adapter_bytes + GB) / MB
            start = time.perf_counter()
            tree = {"algorithm": standalone.algorithm.state_dict(), "federation": standalone.fed.state_dict()}
            save_checkpoint(workdir / "run", standalone.rnd, tree)
            checkpoint_seconds = time.perf_counter() - start
            del standalone, tree
            gc.collect()

            # The yardstick's personalised variant keeps a full state dict per client: measure the
            # growth on a few before its timing rounds leave freed memory in the heap.
            before = rss_mb()
            kept = [copy.deepcopy(model.state_dict()) for _ in range(args.yardstick_rss_clients)]
            per_client_full_mb = (rss_mb() - before) / len(kept)
            del kept
            gc.collect()

            # Timing: the three sides alternate round by round; round 0 of each is warm-up.
            federated_cfg = _config(args.model, num_clients, "federated")
            sides: dict[str, Any] = {
                "ours": Simulation(federated_cfg, resources, client_data, workdir),
                "yardstick": FullStateSwap(model, sizes),
            }
            seconds: dict[str, list[float]] = {name: [] for name in sides}
            for rnd in range(rounds + 1):
                line = []
                for name, side in sides.items():
                    elapsed = side.round()
                    line.append(f"{name} {1000 * elapsed / num_clients:.1f}")
                    if rnd > 0:
                        seconds[name].append(elapsed)
                warm = " (warm-up)" if rnd == 0 else ""
                print(f"round {rnd}{warm}: ms per client: {', '.join(line)}", flush=True)
            del sides
            gc.collect()

        parts = breakdown(model, adapter, num_clients, repeats=10 if args.smoke else 40)
    finally:
        local_training.local_sft = real_local_sft

    ms = {name: 1000 * median(values) / num_clients for name, values in seconds.items()}
    yard_rss = base_rss + num_clients * per_client_full_mb
    results: dict[str, Any] = {
        "model": args.model,
        "config": {"clients_per_round": num_clients, "timed_rounds": rounds, "threads": args.threads},
        "adapter_bytes": adapter_bytes,
        "full_state_bytes": full_state_bytes,
        "overhead_ms_per_client": {
            **ms,
            "yardstick_over_ours": ms["yardstick"] / ms["ours"],
            "target": 50.0,
            "ours_within_target": ms["ours"] <= 50.0,
            "rounds_s": seconds,
            "ours_standalone_rounds_s": standalone_seconds,
        },
        "breakdown_ms": parts,
        "memory_mb": {
            "base_model_rss": base_rss,
            "clients_holding_adapters": held,
            "rss_after": rss_after,
            "peak_rss_after": peak_after,
            "budget": budget,
            "within_budget": rss_after <= budget and peak_after <= budget,
            "yardstick_per_client_full_state": per_client_full_mb,
            "yardstick_rss_extrapolated": yard_rss,
        },
        "checkpoint_seconds_standalone": checkpoint_seconds,
    }
    rows = [
        [
            "overhead per client per round (ms, median)",
            f"{ms['ours']:.1f}",
            f"{ms['yardstick']:.1f}",
            "<= 50",
        ],
        [
            "  load adapter into the model (ms)",
            f"{parts['load_adapter']:.2f}",
            f"{parts['yardstick_load_state_dict']:.1f} (full state)",
            "",
        ],
        [
            "  adapter back out as arrays (ms)",
            f"{parts['adapter_arrays']:.2f}",
            f"{parts['yardstick_deepcopy_state_dict']:.1f} (deepcopy)",
            "",
        ],
        [
            "  reply validation (ms)",
            f"{parts['validate_reply']:.2f}",
            "",
            "",
        ],
        [
            "  weighted average, per client (ms)",
            f"{parts['weighted_average_per_client']:.2f}",
            "",
            "",
        ],
        ["base model RSS (MB)", f"{base_rss:.0f}", f"{base_rss:.0f}", ""],
        [
            f"RSS with {num_clients} personal states (MB)",
            f"{rss_after:.0f} (peak {peak_after:.0f})",
            f"{yard_rss:.0f} (extrapolated)",
            f"<= {budget:.0f}",
        ],
        ["state per client (MB)", f"{adapter_bytes / MB:.2f}", f"{per_client_full_mb:.2f}", ""],
    ]
    headers = [
        "measure",
        "ours (fedtune)",
        "yardstick (full state swap)",
        "target",
    ]
    markdown = (
        f"P4 simulation overhead, {args.model} fp32 CPU, {num_clients} clients per round, "
        f"{rounds} timed rounds per side (alternating)\n\n"
        + markdown_table(headers, rows)
        + f"\n\nCheckpoint of a standalone round ({num_clients} personal adapters): "
        + f"{checkpoint_seconds:.2f} s"
    )
    print(markdown)
    write_results("p4", results, markdown, args, began)
    return results


if __name__ == "__main__":
    main()
