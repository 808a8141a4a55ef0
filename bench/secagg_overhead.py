"""SecAgg: what secure aggregation (SecAgg+) costs per round, against the plain upload of the same updates.

Each of ``--clients`` (10 and 100) clients holds a synthetic update of ``--size`` values (default
460,800: the LoRA r = 8 on q and v of SmolLM2-135M, what FedIT's clients upload). ``plain``: every client
uploads its update as float32 arrays and the server takes the weighted mean (``weighted_average``), as a
FedIT round without secure aggregation does. ``secure``: the same updates through the four SecAgg+ stages
(``fedtune.fl.secagg.secure_sum``: key advertisement, encrypted share exchange through the server,
masked upload, unmasking) with one client dropping after the key exchange, so the round also rebuilds a
dropped client's masks. Both run in one process through ``InProcessFederation``, which counts every
message's bytes as a real run does and times each client's task; the sides alternate, the first round
of each is warm-up; the plain side loses the same client. Reported per round: the mean seconds a client
spends (all its tasks; in a deployment the clients run in parallel, here one after another), the
server's own seconds (wall minus the clients'), the wall seconds in this process, and bytes up and down
per client of the round.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, median, parse, write_results

LORA_SMOLLM2 = 460_800
"""LoRA r = 8 on q_proj (576 x 576) and v_proj (576 x 192) in each of SmolLM2-135M's 30 layers."""


class Round:
    """``clients`` in-process clients with fixed synthetic updates; plain and secure rounds over them."""

    def __init__(self, clients: int, size: int, seed: int, workdir: Path) -> None:
        import numpy as np

        from fedtune.config import validate_config
        from fedtune.fl import secagg
        from fedtune.fl.simulation import InProcessFederation

        self.ids = [f"c{i:03d}" for i in range(clients)]
        rng = np.random.default_rng(seed)
        self.updates = {c: rng.normal(0, 0.01, size).astype(np.float32) for c in self.ids}
        self.weights = {c: int(rng.integers(10, 100)) for c in self.ids}
        self.size = size
        tasks = {**secagg.client_tasks(), "plain_fit": self._plain_fit}
        cfg = validate_config({"data": {"partition": {"num_clients": clients}}, "fed": {"screen": None}})
        self.fed = InProcessFederation(cfg, tasks, {c: [] for c in self.ids}, None, workdir)  # type: ignore[arg-type]
        self.settings = secagg.SecAggSettings(threshold=0.7, bits=20, clip_range=0.1, seed=seed)
        self.dropped = self.ids[1]

    def _plain_fit(self, ctx: Any, msg: Any) -> Any:
        if ctx.client_id == self.dropped:  # the same client is lost on both sides
            raise RuntimeError("dropped before its upload")
        return {"w": self.updates[ctx.client_id], "num_examples": self.weights[ctx.client_id]}

    def _measure(self, rnd: int, body: Any) -> dict[str, float]:
        self.fed.begin_round(rnd)
        start = time.perf_counter()
        body(rnd)
        wall = time.perf_counter() - start
        traffic = self.fed.traffic
        client_seconds = sum(traffic.client_seconds.values())
        count = len(self.ids)
        return {
            "wall_s": wall,
            "client_s_mean": client_seconds / count,
            "server_s": max(0.0, wall - client_seconds),
            "bytes_up_per_client": traffic.bytes_up / count,
            "bytes_down_per_client": traffic.bytes_down / count,
        }

    def plain(self, rnd: int) -> dict[str, float]:
        from fedtune.fl.aggregate import weighted_average

        def body(rnd: int) -> None:
            replies = self.fed.call(self.ids, "plain_fit", {"round": rnd})
            weighted_average([{"w": r["w"]} for r in replies.values()], [self.weights[c] for c in replies])

        return self._measure(rnd, body)

    def secure(self, rnd: int) -> dict[str, float]:
        from fedtune.fl import secagg

        def lose(client: str, task: str, at: int) -> None:
            if client == self.dropped and task == "secagg_mask":
                raise RuntimeError("dropped after the key exchange")

        def body(rnd: int) -> None:
            for client in self.ids:
                self.fed.states[client][secagg.UPDATE] = {
                    "round": rnd,
                    "keys": ["w"],
                    "update": self.updates[client],
                    "weight": self.weights[client],
                }
            result = secagg.secure_sum(self.fed, self.ids, self.size, self.weights, rnd, self.settings)
            assert result.dropped == [self.dropped], result.dropped

        self.fed.before_task = lose
        try:
            return self._measure(rnd, body)
        finally:
            self.fed.before_task = None


def measure(clients: int, size: int, repeats: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        job = Round(clients, size, seed, Path(workdir))
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "secure": []}
        rnd = 0
        for repeat in range(repeats + 1):  # round 0 of each side is warm-up
            for side in ("plain", "secure"):
                rnd += 1
                numbers = getattr(job, side)(rnd)
                if repeat:
                    runs[side].append(numbers)
    summary = {side: {key: median(r[key] for r in rows) for key in rows[0]} for side, rows in runs.items()}
    ratios = {
        key: summary["secure"][key] / summary["plain"][key]
        for key in ("wall_s", "server_s", "bytes_up_per_client", "bytes_down_per_client")
        if summary["plain"][key] > 0
    }
    return {"clients": clients, "size": size, "summary": summary, "secure_vs_plain": ratios, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--size", type=int, default=LORA_SMOLLM2)
    parser.add_argument("--repeats", type=int, default=3)
    args, start = parse(parser, argv)
    if args.smoke:
        args.clients, args.size, args.repeats = [4], 1000, 1
    results = [measure(n, args.size, args.repeats, args.seed) for n in args.clients]
    rows = []
    for result in results:
        for side in ("plain", "secure"):
            numbers = result["summary"][side]
            rows.append(
                [
                    result["clients"],
                    side,
                    numbers["wall_s"],
                    numbers["client_s_mean"],
                    numbers["server_s"],
                    numbers["bytes_up_per_client"] / 2**20,
                    numbers["bytes_down_per_client"] / 2**20,
                ]
            )
        ratio = result["secure_vs_plain"]
        rows.append(
            [
                result["clients"],
                "secure / plain",
                ratio["wall_s"],
                "",
                ratio["server_s"],
                ratio["bytes_up_per_client"],
                "",
            ]
        )
    headers = [
        "clients",
        "side",
        "round s",
        "client s (mean)",
        "server s",
        "up MiB/client",
        "down MiB/client",
    ]
    title = (
        f"SecAgg: secure aggregation (SecAgg+, 20 bits, one client dropped after the key exchange) vs "
        f"plain uploads, {args.size:,} float32 values per client, median of {args.repeats} rounds"
    )
    markdown = f"{title}\n\n{markdown_table(headers, rows)}\n"
    print(markdown)
    write_results("secagg", {"results": results}, markdown, args, start)


if __name__ == "__main__":
    main()
