"""P7: FedMKT's bytes on the wire per client and round, against FATE-LLM's encoding at equal k, and
the server's per-round time to take one client's knowledge onto the LLM's tokenization.

Knowledge = per-sample loss + top-k logits of every response token of the public set, computed by
the real models (SmolLM2-135M-Instruct uploads, Qwen2.5-Coder-0.5B-Instruct broadcasts). Encodings:
- ``fate``: the yardstick, top-k values as fp32 and ids as int64 in Python lists (pickled);
- ``fedtune``: what fedtune sends (``fedmkt.wire``: fp16 values, narrowest unsigned ids, no offsets);
- ``fedtune+zlib``: the same with ``fedmkt.compress`` (the default): ids as byte planes, values as
  byte planes of their row differences, each deflated (level 6; lossless, ``fedmkt.wire``).
Server time: unpacking one client's upload and aligning it to the LLM's tokens (vocabulary map and
sequence alignments computed in the first round, cached after: both are shown).

    python bench/fedmkt_wire.py              # real models, 64 public examples, k = 16 and 128
    python bench/fedmkt_wire.py --smoke      # tiny random models, seconds
"""

from __future__ import annotations

import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Start, base_parser, markdown_table, setup_torch, write_results

CLIENT, SERVER = "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"


def knowledge_of(name: str, records: list[Any], k: int, max_length: int) -> tuple[Any, Any, Any]:
    from fedtune.algorithms.fedmkt.transfer import public_knowledge, public_view
    from fedtune.algorithms.fedmkt.wire import Knowledge
    from fedtune.data.tokenize import make_batches
    from fedtune.models.loading import load_causal_lm

    model, tokenizer = load_causal_lm(name)
    view = public_view(records, tokenizer, "alpaca", max_length)
    batches = make_batches(
        view.examples, 8, int(tokenizer.pad_token_id or 0), seed=0, bucketing=False, shuffle=False
    )
    losses, ids, values = public_knowledge(model, batches, k, len(tokenizer))
    return Knowledge(losses, ids, values), tokenizer, view


def narrowed(knowledge: Any, k: int) -> Any:
    from fedtune.algorithms.fedmkt.wire import Knowledge

    return Knowledge(
        knowledge.losses, [i[:, :k] for i in knowledge.ids], [v[:, :k] for v in knowledge.values]
    )


def encodings(knowledge: Any, vocab: int) -> dict[str, int]:
    payload = knowledge.pack("public/", vocab)
    ours = sum(value.nbytes for value in payload.values())
    deflated = sum(value.nbytes for value in knowledge.pack("public/", vocab, compress=True).values())
    fate = len(
        pickle.dumps(
            {
                "loss": knowledge.losses.astype(float).tolist(),
                "topk_logits": [v.astype(float).tolist() for v in knowledge.values],
                "topk_ids": [i.astype(int).tolist() for i in knowledge.ids],
            },
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    )
    return {"fate": fate, "fedtune": ours, "fedtune+zlib": deflated}


def server_time(
    knowledge: Any, client_tok: Any, client_view: Any, llm_tok: Any, llm_view: Any, k: int
) -> dict[str, float]:
    from fedtune.algorithms.fedmkt.transfer import alignments, teacher_rows
    from fedtune.algorithms.fedmkt.wire import unpack_knowledge
    from fedtune.align import vocab_map

    payload = knowledge.pack("public/", len(client_tok), compress=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cold:  # computed, not read from an earlier run's cache
        vmap = vocab_map(client_tok, llm_tok, cache_dir=Path(cold))
    map_seconds = time.perf_counter() - start
    start = time.perf_counter()
    matches = alignments(client_view, llm_view)
    align_seconds = time.perf_counter() - start
    start = time.perf_counter()
    received = unpack_knowledge(payload, "public/", client_view.counts, len(client_tok), k)
    teacher_rows(received, client_view, llm_view, matches, vmap)
    per_round = time.perf_counter() - start
    return {"vocab_map_s": map_seconds, "sequence_alignment_s": align_seconds, "per_round_s": per_round}


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--top-k", type=int, nargs="+", default=[16, 128])
    args = parser.parse_args(argv)
    setup_torch(args.threads)
    from fedtune.data.builtin import load_builtin

    began = Start()
    client, server = ("tiny-llama-bpe", "tiny-qwen2-spm") if args.smoke else (CLIENT, SERVER)
    count = 4 if args.smoke else args.examples
    records = load_builtin("wordnet-instruct", "public")[:count]
    results: dict[str, Any] = {"client": client, "server": server, "examples": count, "rows": []}
    rows = []
    # Top-k comes sorted: the top-16 is the first 16 columns of the top-128, one forward pass per model.
    widest = max(args.top_k)
    up_all, client_tok, client_view = knowledge_of(client, records, widest, args.max_length)
    down_all, llm_tok, llm_view = knowledge_of(server, records, widest, args.max_length)
    for k in args.top_k:
        up, down = narrowed(up_all, k), narrowed(down_all, k)
        for direction, knowledge, tok in (("up (client)", up, client_tok), ("down (LLM)", down, llm_tok)):
            sizes = encodings(knowledge, len(tok))
            tokens = sum(len(i) for i in knowledge.ids)
            entry = {"k": k, "direction": direction, "tokens": tokens, **sizes}
            entry["ratio"] = sizes["fate"] / sizes["fedtune"]
            entry["ratio_zlib"] = sizes["fate"] / sizes["fedtune+zlib"]
            results["rows"].append(entry)
            rows.append(
                [
                    k,
                    direction,
                    tokens,
                    f"{sizes['fate']:,}",
                    f"{sizes['fedtune']:,}",
                    f"{sizes['fedtune+zlib']:,}",
                    f"{entry['ratio']:.2f}x",
                    f"{entry['ratio_zlib']:.2f}x",
                ]
            )
        if k == args.top_k[0]:
            results["server"] = {**server_time(up, client_tok, client_view, llm_tok, llm_view, k), "k": k}
    timing = results["server"]
    markdown = "\n".join(
        [
            f"# P7: FedMKT bytes per client and round ({count} public examples; {client} -> {server})",
            "",
            markdown_table(
                [
                    "k",
                    "direction",
                    "tokens",
                    "FATE-LLM (B)",
                    "fedtune (B)",
                    "fedtune+zlib (B)",
                    "vs FATE",
                    "vs FATE (zlib)",
                ],
                rows,
            ),
            "",
            f"Server, one client's upload onto the LLM's tokens (k = {timing['k']}): vocabulary map "
            f"{timing['vocab_map_s']:.2f} s and sequence alignments {timing['sequence_alignment_s']:.2f} s "
            f"(once per client tokenizer, cached), then {timing['per_round_s']:.3f} s per round "
            "(inflate + unpack + project).",
        ]
    )
    write_results("p7", results, markdown, args, began)
    print(markdown)


if __name__ == "__main__":
    main()
