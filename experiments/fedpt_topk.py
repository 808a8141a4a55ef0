"""FedPT's final model when the large model answers over HTTP with its top k log-probabilities.

Benchmark P13 (``bench/fedpt_http_topk.py``) measures how far the residual fill moves the teacher and
one decoding step; this trains FedPT at each ``k`` and scores the model it ends with (Rouge-L with the
config's sampling, Dist-3, test perplexity), with the API's requests, bytes and seconds.

    python experiments/fedpt_topk.py configs/paper/fedpt-smollm2.yaml               # local + k 5 20 128
    python experiments/fedpt_topk.py configs/paper/fedpt-smollm2.yaml --table-only

Rows, each a run directory ``<runs-dir>/<config name>-topk/<row>-s<seed>``:
- ``local``: the exact local source. It stands for ``k = V``: a run over HTTP at the whole vocabulary
  gives the local run's metrics (``tests/integration/test_http_source.py``), and on a 49k vocabulary it
  would move ~190 MB of JSON per teacher row.
- ``k<k>``: ``fedpt.large_model`` is ``fedtune serve <large model>`` (no log-probability limit), started
  by this script on loopback in its own process; the run asks for ``fedpt.top_k = k``.
Every row fixes alpha (``--alpha``, no search: the search decodes the validation set once per candidate,
over HTTP one request per row and step) and scores the in-domain test set only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import tables


def row_overrides(alpha: float) -> list[str]:
    return [f"fedpt.alpha={alpha:g}", "fedpt.alpha_search=never", "eval.extra_datasets=[]"]


def http_overrides(url: str, model: str, k: int) -> list[str]:
    return [f"fedpt.large_model={url}", f"fedpt.large_model_name={model}", f"fedpt.top_k={k}"]


class LogitsServer:
    """``fedtune serve MODEL`` in a process of its own (one thread; it dies with this script), until the
    ``with`` block ends."""

    def __init__(self, model: str, port: int, log: Path) -> None:
        self.model, self.port, self.log = model, port, log
        self.url = f"http://127.0.0.1:{port}/v1"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LogitsServer:
        from fedtune.flower.processes import spawn

        command = [sys.executable, "-m", "fedtune", "serve", self.model, "--port", str(self.port)]
        command += ["--max-logprobs", "-1", "--device", "cpu"]
        env = dict(os.environ) | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._process = spawn(command, self.log, env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"fedtune serve {self.model} exited; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"fedtune serve {self.model} did not answer on port {self.port}; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        from fedtune.flower.processes import kill_tree

        if self._process is not None:
            kill_tree(self._process)


def summarise(run_dirs: list[Path]) -> dict[str, Any]:
    """The final evaluation (mean over seeds of the run; the ± is the sampling seeds' std) and the API
    use: the teacher's (round rows) and the final evaluation's."""
    out: dict[str, Any] = {"seeds": 0}
    for run_dir in run_dirs:
        rows = tables.finished_rows(run_dir)
        final = tables.last_evaluated(rows)
        if final is None:
            continue
        seed = tables.seed_of(run_dir)
        out["seeds"] += 1
        metrics = final["eval"]
        for key in ("rougeL", "rougeL_std", "dist3", "perplexity", "alpha"):
            if key in metrics:
                out.setdefault(key, {})[seed] = metrics[key]
        trained = tables.trained_rows(rows)
        kd = [r["kd_kl"] for r in trained if "kd_kl" in r]
        if kd:
            out.setdefault("kd_kl", {})[seed] = sum(kd) / len(kd)
        for scope, source in (("teacher", trained), ("eval", [metrics])):
            for name in ("requests", "seconds", "bytes_down"):
                values = [r["api_" + name] for r in source if "api_" + name in r]
                if values:
                    out.setdefault(f"{scope}_api_{name}", {})[seed] = float(sum(values))
    return out


def _mean(result: dict[str, Any], key: str) -> float | None:
    values = list(result.get(key, {}).values())
    return sum(values) / len(values) if values else None


def _num(value: float | None, digits: int = 2, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def markdown(cfg: Any, results: dict[str, dict[str, Any]], vocab: str, command: str) -> str:
    rows = []
    for name, r in results.items():
        if not r["seeds"]:
            continue
        rouge, std = _mean(r, "rougeL"), _mean(r, "rougeL_std")
        rows.append(
            [
                f"{vocab} (local source)" if name == "local" else name.removeprefix("k"),
                "-" if rouge is None else tables.plus_minus(100 * rouge, None if std is None else 100 * std),
                _num(_mean(r, "dist3"), 3),
                _num(_mean(r, "perplexity")),
                _num(_mean(r, "kd_kl")),
                _num(_mean(r, "teacher_api_requests"), 0),
                _num(_mean(r, "teacher_api_seconds"), 0),
                _num(_mean(r, "teacher_api_bytes_down"), 1, 1e-6),
                _num(_mean(r, "eval_api_requests"), 0),
                _num(_mean(r, "eval_api_seconds"), 0),
                str(r["seeds"]),
            ]
        )
    header = ["k", "Rouge-L x 100", "Dist-3", "test ppl", "KD KL (mean over rounds)"]
    header += ["teacher requests", "teacher API s", "teacher MB down", "eval requests", "eval API s", "runs"]
    return "\n".join(
        [
            f"# {cfg.name}: FedPT's final model with the large model over HTTP at top-k",
            "",
            f"`{command}`",
            "",
            f"{cfg.fedpt.large_model} served by `fedtune serve` on loopback (one thread); "
            f"alpha fixed at {cfg.fedpt.alpha:g}; Rouge-L on {cfg.eval.max_examples} test examples of "
            f"{cfg.data.dataset} sampled at temperature {cfg.eval.temperature:g} over {cfg.eval.seeds} "
            "sampling seeds (the ± is their std). The teacher is computed once per run (round 1); the "
            "evaluation's API use is the final evaluation's (decoding re-sends each row's prefix every "
            "step, plus test perplexity).",
            "",
            tables.markdown_table(header, rows),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__, jobs=False)
    parser.add_argument("--ks", nargs="+", type=int, default=[5, 20, 128])
    parser.add_argument("--alpha", type=float, default=1.8, help="alpha of every row (no search)")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args(argv)
    common = [*row_overrides(args.alpha), *args.set]
    args.set = common
    cfg = tables.load_config(args)
    base = args.runs_dir / f"{cfg.name}-topk"
    large = cfg.fedpt.large_model
    url = f"http://127.0.0.1:{args.port}/v1"
    names = ["local", *(f"k{k}" for k in args.ks)]
    dirs = {name: tables.seed_dirs(base, name, args.seeds) for name in names}
    if not args.table_only:
        for seed, run_dir in zip(args.seeds, dirs["local"], strict=True):
            tables.run(args.config, [*common, f"seed={seed}"], run_dir)
        with LogitsServer(large, args.port, base / "server.log"):
            for k in args.ks:
                for seed, run_dir in zip(args.seeds, dirs[f"k{k}"], strict=True):
                    tables.run(
                        args.config, [*common, *http_overrides(url, large, k), f"seed={seed}"], run_dir
                    )
    results = {name: summarise(paths) for name, paths in dirs.items()}
    vocab = _vocab_size(large)
    command = tables.command_line(__file__, argv)
    stem = args.results_dir / f"topk-{cfg.name}"
    tables.write_table(stem, markdown(cfg, results, vocab, command), cfg.name, command, results, args)


def _vocab_size(model: str) -> str:
    from fedtune.models.loading import load_tokenizer

    return f"{len(load_tokenizer(model)):,} (all)"


if __name__ == "__main__":
    main()
