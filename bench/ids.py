"""Every benchmark: its id, the script that measures it, its results file, what it measures against
which yardstick, and its target where it has one. The one place ids are named.

``python -m bench ID [args]`` runs ``bench/<script>.py`` with the id's own arguments and then ``args``;
the script writes ``bench/results/<results>.{json,md}`` (``<results>.smoke.*`` with ``--smoke``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    script: str
    """``bench/<script>.py``"""
    results: str
    """``bench/results/<results>.{json,md}``; ``<config name>`` is the name of the config it was given"""
    measures: str
    yardstick: str
    target: str = ""
    """what the ratio must reach ("" where the benchmark has no target, only numbers to report)"""
    args: tuple[str, ...] = ()
    """arguments that come before the caller's (a script that measures two ids runs only this one)"""


BENCHMARKS: dict[str, Benchmark] = {
    "p1": Benchmark(
        "token_align",
        "p1",
        "FedMKT's token alignment, vocabulary: the MinED map of one tokenizer's vocabulary onto another's",
        "a brute force over the target vocabulary (FATE-LLM's loop, a process pool): the same map, time",
        "identical map, >= 100x on a 2,000-token sample, a whole map < 60 s on 2 cores",
        ("--only", "p1"),
    ),
    "p2": Benchmark(
        "token_align",
        "p2",
        "FedMKT's token alignment, sequences: the DTW alignment of two tokenizations of one text",
        "the same DTW as plain Python loops and on a numpy table (FATE-LLM's dtw): the same path, time",
        "the same path, >= 50x per sample",
        ("--only", "p2"),
    ),
    "p3": Benchmark(
        "sft_throughput",
        "p3",
        "local LoRA SFT throughput: steps/s and real (non-pad) tokens/s",
        "transformers.Trainer fed the same batches in the same order",
        ">= 1.0x Trainer; >= 1.3x its real tokens/s with length bucketing",
    ),
    "p4": Benchmark(
        "simulation_overhead",
        "p4",
        "the simulation's overhead per client and round (everything but forward/backward), and the RSS "
        "of 100 clients each holding its own adapter",
        "one model whose full state dict is swapped per client (OpenFedLLM style)",
        "<= 50 ms per client and round; RSS <= base model + 100 x adapter + 1 GB",
    ),
    "p5": Benchmark(
        "proxy_decoding",
        "p5",
        "proxy-tuned decoding throughput (large model + tuned and base small model)",
        "the proxy-tuning reference loop (three forwards one after the other); the bound "
        "1 / (t_large + t_small_tuned + t_small_base)",
        "batch 1 >= 0.9x the bound; batch 8 >= 2x the reference loop; the same greedy tokens",
    ),
    "p6": Benchmark(
        "fedpt_server_time",
        "p6",
        "FedPT's server time per round with the frozen teacher's logits computed once and cached",
        "the same round recomputing them every round; one KD pass of the small model",
        "cached <= 1.5x one KD pass",
    ),
    "p7": Benchmark(
        "fedmkt_wire",
        "p7",
        "FedMKT's bytes per client and round (fp16 values, narrowest ids, deflated), and the server's "
        "time to take one upload onto the LLM's tokens",
        "FATE-LLM's pickled fp32 / int64 lists at equal top-k",
    ),
    "p8": Benchmark(
        "flower_overhead",
        "p8",
        "the round time of a FedIT job on a Flower loopback deployment",
        "the same job in-process",
        "Flower <= 1.25x in-process per round; the same metrics",
    ),
    "p9": Benchmark(
        "lora_mfu",
        "p9",
        "the model FLOPs utilisation of a LoRA step on a random-init ~1B Llama in bf16 on CUDA "
        "(6N + 12Lds FLOPs per token; the executed 4N + 6N_lora + 12Lds reported too)",
        "the card's peak dense bf16 FLOP/s (a table of known cards, or --peak-tflops)",
        ">= 40% MFU",
    ),
    "p16": Benchmark(
        "ray_overhead",
        "p16",
        "the round time of a FedIT job on Ray actors (2 actors x 1 thread)",
        "the same job in-process with 2 threads",
        ">= 1.5x on the tiny model, >= 1.1x on SmolLM2; dispatch < 1 s a round above the slowest client",
    ),
    "p4-ray": Benchmark(
        "ray_memory",
        "p4-ray",
        "each Ray actor's peak RSS with 1,000 standalone clients a round, each keeping its own adapter",
        "the same actor with 2 clients (model loaded, run built)",
        "per actor: peak RSS <= that baseline + the adapters it holds + 1 GB",
    ),
    "p10": Benchmark(
        "perfit_step",
        "p10",
        "PerFIT's masked LoRA step at the expanded rank r_e, and its mask search",
        "dense LoRA steps of rank r and r_e; one local epoch",
        "masked step <= 1.15x a dense rank-r step; the search <= one local epoch",
    ),
    "p11": Benchmark(
        "fedpft_client",
        "p11",
        "a FedPFT client (FFN sub-model): parameters held, peak RSS, local step time, bytes per round; "
        "the server's layer- and neuron-level distillation time",
        "FedPETuning (the full model) and FedOT (layer drop); the share of multiply-adds the client keeps",
    ),
    "p12": Benchmark(
        "choice_scoring",
        "p12",
        "multiple-choice scoring (acc / acc_norm) reading each question's prompt once",
        "every (prompt, choice) sequence scored whole: the same scores, time",
    ),
    "p13": Benchmark(
        "fedpt_http_topk",
        "p13",
        "FedPT's large model behind HTTP (fedtune serve, HTTPLogitSource) at top-k 5/20/128/V: KL of the "
        "large model, the distillation teacher and proxy-tuned decoding; API seconds per request and step",
        "the exact local source (the same weights in-process)",
    ),
    "secagg": Benchmark(
        "secagg_overhead",
        "secagg",
        "secure aggregation (SecAgg+) per round at 10 and 100 clients: seconds and bytes, one client "
        "dropping after the key exchange",
        "the plain upload of the same updates and their weighted mean",
    ),
    "memory-fedbiot": Benchmark(
        "fedbiot_memory",
        "memory-<config name>",
        "the peak RSS of a FedBiOT client process (loopback Flower) for each paper-table method",
        "a FedIT client holding the whole LLM; a process holding no model",
    ),
    "memory-fedmkt": Benchmark(
        "fedmkt_memory",
        "memory-<config name>",
        "the peak RSS of a FedMKT client process (loopback Flower) for each SLM",
        "a FedIT client holding the whole LLM; a process holding no model",
    ),
    "memory-fedkseed": Benchmark(
        "fedkseed_memory",
        "memory-<config name>",
        "the peak RSS of a FedKSeed client process (loopback Flower), restore copy and undo",
        "a FedIT client training LoRA on the same model; a process holding no model",
    ),
    "memory-perfit": Benchmark(
        "perfit_memory",
        "memory-<config name>",
        "the peak RSS of one in-process round in which 100 PerFIT clients each keep their personal state",
        "FIT's same round (no personal state)",
        "FIT's RSS + clients x a dense adapter of rank r_e + 1 GB (P4's budget)",
    ),
    "memory-qlora": Benchmark(
        "qlora_memory",
        "memory-qlora",
        "a LoRA client's peak RSS and step time on an fp32, bf16, 8-bit and 4-bit base, with and without "
        "gradient checkpointing; the quality of a short FedIT run on each",
        "the fp32 base without checkpointing",
    ),
    "distill-fedpft": Benchmark(
        "fedpft_distill",
        "distill-<config name>",
        "the relative error of a FedPFT sub-model's final hidden state after n layer-level distillation "
        "steps, per learning rate",
        "the full model's hidden state (1.0: no closer than a zero vector)",
    ),
    "cli-startup": Benchmark(
        "cli_startup",
        "cli-startup",
        "the CPU and wall seconds of `fedtune` commands that need no model (--help, run --help, a misspelt "
        "config key, models list, data list), each a fresh process",
        "the same commands from another source tree (--baseline-src: an older commit's src/)",
        "< 1 s of CPU each",
    ),
    "serve-load": Benchmark(
        "serve_load",
        "serve-load",
        "fedtune serve under load: 50 short chat requests at once on loopback (a tiny FedIT run): p50/p99 "
        "latency",
        "none: latency figures only (every request answered 200, none refused or timed out)",
    ),
}
