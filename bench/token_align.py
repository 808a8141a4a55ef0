"""P1 and P2: FedMKT's token alignment (`fedtune.align`) against the loops of FATE-LLM.

P1, the minimum-edit-distance vocabulary map, per direction (SmolLM2 <-> Qwen2.5, SmolLM2 <-> Gemma-3):
- a seeded random sample of ``--sample`` source tokens mapped by `nearest_targets` (what
  `vocab_map` runs, its set-up included) and by `brute_force_vocab_map` (for each source token a
  Python loop of an edit distance call over the whole target vocabulary), the latter over a
  process pool of ``--workers`` as FATE-LLM does; both must give the same ids;
- the whole map, timed once (``--workers`` threads, no cache).
P2, the DTW alignment of two tokenizations of one text (built-in ``wordnet-instruct``, ``--texts``
windows of L source tokens for each L in ``--lengths``): `align_sequences` (median of
``--repeats``, after one warm-up call that loads the compiled kernel) against two plain Python
loops that must give the same path: `brute_force_align_sequences` (lists, one edit distance call
per cell) and ``fate_style_dtw`` (FATE-LLM's layout: a numpy table filled cell by cell, np.argmin
on the way back).

    python bench/token_align.py                  # both, real tokenizers (minutes)
    python bench/token_align.py --only p2        # the same as: python -m bench p2
    python bench/token_align.py --smoke          # tiny tokenizers, seconds
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Start, base_parser, markdown_table, median, write_results

REAL = {
    "smollm2": "smollm2-135m-instruct",
    "qwen2.5": "qwen2.5-coder-0.5b-instruct",
    "gemma3": "gemma-3-270m",
}
TINY = {"spm": "tiny-llama-spm", "bpe": "tiny-qwen2-bpe"}
REAL_DIRECTIONS = [
    ("smollm2", "qwen2.5"),
    ("qwen2.5", "smollm2"),
    ("smollm2", "gemma3"),
    ("gemma3", "smollm2"),
]
TINY_DIRECTIONS = [("spm", "bpe"), ("bpe", "spm")]

_pool_vocab: tuple[list[str], list[str]] = ([], [])


def _set_pool_vocab(source_strings: list[str], target_strings: list[str]) -> None:
    global _pool_vocab
    _pool_vocab = (source_strings, target_strings)


def _brute_chunk(ids: list[int]) -> list[int]:
    from fedtune.align import brute_force_vocab_map

    return brute_force_vocab_map(*_pool_vocab, ids).tolist()


def brute_force_pooled(
    source_strings: list[str], target_strings: list[str], ids: list[int], workers: int
) -> Any:
    import numpy as np

    chunks = [ids[start : start + 25] for start in range(0, len(ids), 25)]
    with multiprocessing.get_context("fork").Pool(
        workers, initializer=_set_pool_vocab, initargs=(source_strings, target_strings)
    ) as pool:
        mapped = pool.map(_brute_chunk, chunks)
    return np.asarray([t for chunk in mapped for t in chunk], dtype=np.int64)


def fate_style_dtw(source_strings: list[str], target_strings: list[str]) -> list[tuple[int, int]]:
    """The DTW loop laid out as FATE-LLM's ``dtw``: numpy table with an infinite border."""
    import numpy as np
    from rapidfuzz.distance import Levenshtein

    table = np.full((len(source_strings) + 1, len(target_strings) + 1), np.inf)
    table[0, 0] = 0
    for i, source in enumerate(source_strings):
        for j, target in enumerate(target_strings):
            cost = Levenshtein.distance(source, target)
            table[i + 1, j + 1] = cost + min(table[i, j + 1], table[i + 1, j], table[i, j])
    table = table[1:, 1:]
    i, j = table.shape[0] - 1, table.shape[1] - 1
    path = [(i, j)]
    while i > 0 or j > 0:
        diagonal = table[i - 1, j - 1] if i > 0 and j > 0 else np.inf
        up = table[i - 1, j] if i > 0 else np.inf
        left = table[i, j - 1] if j > 0 else np.inf
        move = int(np.argmin([diagonal, up, left]))
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
        path.append((i, j))
    path.reverse()
    return path


def _strings(names: dict[str, str]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    from fedtune.align import vocabulary_strings
    from fedtune.models.loading import load_tokenizer

    tokenizers = {key: load_tokenizer(name) for key, name in names.items()}
    return tokenizers, {key: vocabulary_strings(tok) for key, tok in tokenizers.items()}


def run_p1(
    directions: Sequence[tuple[str, str]], vocab: dict[str, list[str]], args: Any
) -> list[dict[str, Any]]:
    import numpy as np

    from fedtune.align.vocab import nearest_targets

    rows = []
    for source, target in directions:
        source_strings, target_strings = vocab[source], vocab[target]
        rng = np.random.default_rng(args.seed)
        ids = sorted(
            rng.choice(len(source_strings), min(args.sample, len(source_strings)), replace=False).tolist()
        )
        sample = [source_strings[i] for i in ids]
        fast_seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fast = nearest_targets(sample, target_strings, workers=args.workers)
            fast_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        brute = brute_force_pooled(source_strings, target_strings, ids, args.workers)
        brute_seconds = time.perf_counter() - start
        start = time.perf_counter()
        nearest_targets(source_strings, target_strings, workers=args.workers)
        whole_seconds = time.perf_counter() - start
        row = {
            "direction": f"{source} -> {target}",
            "source_vocab": len(source_strings),
            "target_vocab": len(target_strings),
            "sample": len(ids),
            "identical": bool(np.array_equal(fast, brute)),
            "fast_sample_seconds": fast_seconds,
            "brute_sample_seconds": brute_seconds,
            "speedup": brute_seconds / median(fast_seconds),
            "whole_map_seconds": whole_seconds,
        }
        rows.append(row)
        print(
            f"P1 {row['direction']}: sample {median(fast_seconds):.2f} s vs brute {brute_seconds:.1f} s "
            f"({row['speedup']:.0f}x, identical {row['identical']}), whole map {whole_seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return rows


def _windows(source_tok: Any, target_tok: Any, length: int, count: int) -> list[tuple[list[str], list[str]]]:
    """``count`` consecutive windows of ``length`` source tokens of the built-in text, and the
    target's tokenization of the same text."""
    from fedtune.align import token_strings
    from fedtune.data.builtin import load_builtin

    records = load_builtin("wordnet-instruct", "train")
    text = "\n\n".join(f"{r.instruction}\n{r.output}" for r in records[: 40 * count * max(1, length // 64)])
    ids = source_tok(text, add_special_tokens=False)["input_ids"]
    windows = []
    for index in range(count):
        window = ids[index * length : (index + 1) * length]
        target_ids = target_tok(source_tok.decode(window), add_special_tokens=False)["input_ids"]
        windows.append((token_strings(source_tok, window), token_strings(target_tok, target_ids)))
    return windows


def run_p2(
    directions: Sequence[tuple[str, str]], tokenizers: dict[str, Any], args: Any
) -> list[dict[str, Any]]:
    from fedtune.align import align_sequences, brute_force_align_sequences

    align_sequences(["warm", "up"], ["warm", "up"])  # loads (or compiles) the kernel
    rows = []
    for source, target in directions:
        for length in args.lengths:
            for sample, (source_strings, target_strings) in enumerate(
                _windows(tokenizers[source], tokenizers[target], length, args.texts)
            ):
                fast_seconds = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    path = align_sequences(source_strings, target_strings)
                    fast_seconds.append(time.perf_counter() - start)
                start = time.perf_counter()
                plain = brute_force_align_sequences(source_strings, target_strings)
                plain_seconds = time.perf_counter() - start
                start = time.perf_counter()
                fate = fate_style_dtw(source_strings, target_strings)
                fate_seconds = time.perf_counter() - start
                fast = median(fast_seconds)
                row = {
                    "direction": f"{source} -> {target}",
                    "length": length,
                    "text": sample,
                    "source_tokens": len(source_strings),
                    "target_tokens": len(target_strings),
                    "identical": path == plain == fate,
                    "fast_seconds": fast_seconds,
                    "plain_loop_seconds": plain_seconds,
                    "fate_style_seconds": fate_seconds,
                    "speedup_plain": plain_seconds / fast,
                    "speedup_fate_style": fate_seconds / fast,
                }
                rows.append(row)
                print(
                    f"P2 {row['direction']} L={length} text {sample}: {fast * 1000:.2f} ms vs plain "
                    f"{plain_seconds * 1000:.0f} ms ({row['speedup_plain']:.0f}x), FATE-style "
                    f"{fate_seconds * 1000:.0f} ms ({row['speedup_fate_style']:.0f}x), "
                    f"identical {row['identical']}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def p1_markdown(rows: list[dict[str, Any]], args: Any, names: dict[str, str]) -> str:
    table = [
        [
            r["direction"],
            f"{r['source_vocab']:,} -> {r['target_vocab']:,}",
            r["sample"],
            f"{median(r['fast_sample_seconds']):.2f}",
            f"{r['brute_sample_seconds']:.1f}",
            f"{r['speedup']:.0f}x",
            "yes" if r["identical"] else "NO",
            f"{r['whole_map_seconds']:.1f}",
        ]
        for r in rows
    ]
    headers = ["direction", "vocab", "sample", "ours s", "brute s", "speedup", "identical", "whole map s"]
    return "\n".join(
        [
            f"P1 MinED vocabulary map ({', '.join(f'{k} = {v}' for k, v in names.items())}); "
            f"{args.workers} worker(s) on both sides (brute force: a process pool, FATE-LLM style; ours: "
            f"compiled index, threads from 8192 sources on); sample seeded ({args.seed}); ours = median of "
            f"{args.repeats}",
            "",
            markdown_table(headers, table),
            "",
            "Target: identical, >= 100x the brute force on the sample, whole map < 60 s on 2 cores.",
        ]
    )


def p2_markdown(rows: list[dict[str, Any]], args: Any, names: dict[str, str]) -> str:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["direction"], row["length"]), []).append(row)
    table = []
    for (direction, length), group in groups.items():
        fast = median(median(r["fast_seconds"]) for r in group)
        table.append(
            [
                direction,
                length,
                f"{median(r['target_tokens'] for r in group):.0f}",
                len(group),
                f"{fast * 1000:.2f}",
                f"{median(r['plain_loop_seconds'] for r in group) * 1000:.1f}",
                f"{median(r['fate_style_seconds'] for r in group) * 1000:.1f}",
                f"{min(r['speedup_plain'] for r in group):.0f}x",
                f"{min(r['speedup_fate_style'] for r in group):.0f}x",
                "yes" if all(r["identical"] for r in group) else "NO",
            ]
        )
    headers = [
        "direction", "L source", "L target (median)", "texts", "ours ms", "plain loop ms",
        "FATE-style ms", "speedup vs plain (min)", "speedup vs FATE-style (min)", "same path",
    ]  # fmt: skip
    return "\n".join(
        [
            f"P2 DTW alignment of two tokenizations of built-in wordnet-instruct text "
            f"({', '.join(f'{k} = {v}' for k, v in names.items())}); single thread; ours = median of "
            f"{args.repeats} per text; times are medians over texts, speedups the worst text",
            "",
            markdown_table(headers, table),
            "",
            "Target: the same path, >= 50x per sample. 'plain loop' = lists and one rapidfuzz distance "
            "call per cell (brute_force_align_sequences); 'FATE-style' = the same loop on a numpy table "
            "as FATE-LLM's dtw.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P1/P2")
    parser.add_argument("--only", choices=["p1", "p2"], default=None, help="run one benchmark")
    parser.add_argument("--sample", type=int, default=None, help="P1 sampled source tokens (default 2000)")
    parser.add_argument("--workers", type=int, default=2, help="P1 processes / threads on both sides")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="P2 source lengths (256 1024)")
    parser.add_argument("--texts", type=int, default=None, help="P2 texts per length (default 3)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    args.sample = args.sample or (60 if args.smoke else 2000)
    args.lengths = args.lengths or ([32, 64] if args.smoke else [256, 1024])
    args.texts = args.texts or (1 if args.smoke else 3)
    names = TINY if args.smoke else REAL
    directions = TINY_DIRECTIONS if args.smoke else REAL_DIRECTIONS
    tokenizers, vocab = _strings(names)
    config = vars(args) | {"results_dir": str(args.results_dir), "models": names}
    if args.only in (None, "p1"):
        began = Start()
        rows = run_p1(directions, vocab, args)
        markdown = p1_markdown(rows, args, names)
        print(markdown)
        write_results("p1", {"config": config, "directions": rows}, markdown, args, began)
    if args.only in (None, "p2"):
        began = Start()
        rows = run_p2(directions[::2], tokenizers, args)
        markdown = p2_markdown(rows, args, names)
        print(markdown)
        write_results("p2", {"config": config, "samples": rows}, markdown, args, began)


if __name__ == "__main__":
    main()
