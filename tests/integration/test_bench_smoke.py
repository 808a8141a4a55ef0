"""The benchmark scripts run end to end at smoke size and write well-formed results."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.integration.helpers import ROOT


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.fixture(autouse=True)
def _keep_threads() -> object:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_p3_smoke_writes_results(tmp_path: Path) -> None:
    _load("sft_throughput").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p3.smoke.json").read_text())
    assert (tmp_path / "p3.smoke.md").read_text().startswith("P3")
    assert record["smoke"] is True and record["model"] == "tiny-llama"
    assert {"machine", "command", "started", "finished"} <= set(record)
    assert record["machine"]["versions"]["torch"]
    summary = record["summary"]
    assert set(summary) == {"ours", "trainer", "ours_bucketed"}
    for variant, numbers in summary.items():
        assert _positive(numbers["steps_per_s"]) and _positive(numbers["real_tokens_per_s"]), variant
        if variant != "trainer":
            assert _positive(numbers["steps_per_s_vs_trainer"])
            assert _positive(numbers["real_tokens_per_s_vs_trainer"])
    runs = record["runs"]
    assert len(runs) == 3 and all(run["timed_steps"] == 2 for run in runs)
    # Ours and Trainer are fed the very same batches: the same real tokens are timed.
    by_variant = {run["variant"]: run for run in runs}
    assert by_variant["ours"]["real_tokens"] == by_variant["trainer"]["real_tokens"]
    assert by_variant["ours"]["padded_tokens"] == by_variant["trainer"]["padded_tokens"]


def test_p4_smoke_writes_results(tmp_path: Path) -> None:
    _load("simulation_overhead").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p4.smoke.json").read_text())
    assert (tmp_path / "p4.smoke.md").read_text().startswith("P4")
    assert record["smoke"] is True and record["config"]["clients_per_round"] == 10
    overhead = record["overhead_ms_per_client"]
    assert _positive(overhead["ours"]) and _positive(overhead["yardstick"])
    assert all(len(rounds) == 1 for rounds in overhead["rounds_s"].values())
    memory = record["memory_mb"]
    assert memory["clients_holding_adapters"] == 10
    for key in ("base_model_rss", "rss_after", "peak_rss_after", "budget", "yardstick_rss_extrapolated"):
        assert _positive(memory[key]), key
    assert all(_positive(ms) for ms in record["breakdown_ms"].values())
    assert _positive(record["adapter_bytes"]) and record["full_state_bytes"] > record["adapter_bytes"]


def test_p5_smoke_writes_results(tmp_path: Path) -> None:
    _load("proxy_decoding").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p5.smoke.json").read_text())
    assert (tmp_path / "p5.smoke.md").read_text().startswith("P5")
    assert record["smoke"] is True and record["small_model"] == "tiny-llama-L2-H32"
    summary = record["summary"]
    assert _positive(summary["bound_tokens_per_s"])
    assert all(_positive(value) for value in summary["tokens_per_s"].values())
    assert set(summary["vs_yardstick"]) == {
        "ours_fused_b1",
        "ours_separate_b1",
        "ours_fused_b8",
        "ours_separate_b8",
    }
    # Greedy proxy-tuned decoding is exact: ours writes the reference loop's tokens.
    assert all(record["exact"].values()), record["exact"]
    assert {run["rows"] for run in record["runs"]} == {1, 8}


def test_p6_smoke_caches_the_teacher_once(tmp_path: Path) -> None:
    _load("fedpt_server_time").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p6.smoke.json").read_text())
    assert (tmp_path / "p6.smoke.md").read_text().startswith("# P6")
    cached, recomputed = record["rounds"]["disk"], record["rounds"]["recompute"]
    assert cached[0]["teacher_seconds"] > 0 and all(r["teacher_seconds"] == 0.0 for r in cached[1:])
    assert all(r["teacher_seconds"] > 0 for r in recomputed)
    assert record["cache_mb"] > 0 and _positive(record["summary"]["disk"]["ratio_to_kd_pass"])


@pytest.mark.slow  # a Flower run beside an in-process one: 76 s in CI; test_flower.py checks they agree
def test_p8_smoke_runs_both_backends(tmp_path: Path) -> None:
    _load("flower_overhead").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p8.smoke.json").read_text())
    assert (tmp_path / "p8.smoke.md").read_text().startswith("P8")
    assert record["smoke"] is True and record["clients"] == 2 and record["timed_rounds"] == [2]
    summary = record["summary"]
    assert _positive(summary["round_seconds"]["in_process"]) and _positive(summary["round_seconds"]["flower"])
    assert _positive(summary["ratio"])
    # The two backends wrote the same metrics (loss, eval, bytes) for the same job.
    assert record["same_metrics"] is True
    assert {run["side"] for run in record["runs"]} == {"in_process", "flower"}


def test_p10_smoke_times_masked_and_dense_steps(tmp_path: Path) -> None:
    _load("perfit_step").main(["--smoke", "--results-dir", str(tmp_path), "--threads", "1"])
    record = json.loads((tmp_path / "p10.smoke.json").read_text())
    assert (tmp_path / "p10.smoke.md").read_text().startswith("P10")
    assert set(record["median_seconds_per_step"]) == {"dense_r", "dense_re", "masked_re"}
    assert all(_positive(v) for v in record["median_seconds_per_step"].values())
    assert record["config"]["rank_e"] == 16 and _positive(record["search_over_epoch"])


def test_p7_smoke_writes_results(tmp_path: Path) -> None:
    _load("fedmkt_wire").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p7.smoke.json").read_text())
    assert (tmp_path / "p7.smoke.md").read_text().startswith("# P7")
    assert {row["k"] for row in record["rows"]} == {16, 128}
    for row in record["rows"]:
        assert row["fedtune"] < row["fate"] and row["fedtune+zlib"] < row["fedtune"]
    assert _positive(record["server"]["per_round_s"])


def test_p11_smoke_measures_three_client_models(tmp_path: Path) -> None:
    _load("fedpft_client").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p11.smoke.json").read_text())
    assert (tmp_path / "p11.smoke.md").read_text().startswith("# P11")
    assert [entry["model"] for entry in record["models"]] == ["tiny-bert-L4-H32", "tiny-llama-L4-H32"]
    for entry in record["models"]:
        full, sub, drop = (entry["variants"][v] for v in ("fedpetuning", "fedpft", "fedot"))
        # The sub-model keeps every layer's attention: it trains and sends what the full model does.
        assert sub["trained_params"] == full["trained_params"] > drop["trained_params"]
        # FedOT trains LoRA on its adapter only: the first and last of the four layers.
        assert 2 * drop["lora_params"] == full["lora_params"] == sub["lora_params"] > 0
        heads = {v["trained_params"] - v["lora_params"] for v in (full, sub, drop)}
        assert len(heads) == 1 and heads.pop() > 0
        assert sub["bytes_up_per_round"] == full["bytes_up_per_round"] == 4 * full["trained_params"]
        assert sub["ffn_params"] < full["ffn_params"] and sub["params"] < full["params"]
        assert sub["bytes_down_once"] < full["bytes_down_once"]
        # Only the compressed layers' FFNs are re-sent; the first and last layers stay whole.
        assert 0 < sub["bytes_ffn_resend"] < 4 * sub["ffn_params"]
        assert 0 < sub["expected_step_ratio"] < 1 and full["expected_step_ratio"] == 1
        for numbers in (full, sub, drop):
            assert _positive(numbers["step_s"]) and len(numbers["step_seconds"]) == 2
            assert numbers["peak_rss_mb"] >= numbers["baseline_rss_mb"] > 0
        server = entry["server"]
        assert _positive(server["layer_distill_s"]) and _positive(server["neuron_distill_s"])


def test_perfit_memory_smoke_counts_every_clients_state(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    _load("perfit_memory").main([str(config), "--clients", "4", "--results-dir", str(tmp_path)])
    results = json.loads((tmp_path / "memory-perfit-tiny.json").read_text())["results"]
    assert results["fit"]["clients_holding"] == 0 and results["perfit"]["clients_holding"] == 4
    # the state of a client is its packed mask (r_e entries, 1 bit each) + rank-r values (fp32)
    assert 0 < results["perfit"]["client_state_mb"] < results["budget"]["dense_adapter_mb"]
    assert _positive(results["perfit"]["peak_rss_mb"]) and _positive(results["budget"]["budget_mb"])
    assert "P4 budget" in (tmp_path / "memory-perfit-tiny.md").read_text()


def test_fedpft_distill_smoke_measures_the_error_at_every_checkpoint(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpft-tiny.yaml"
    argv = [str(config), "--steps", "1", "3", "--public", "8", "--held-out", "4", "--lrs", "1e-3"]
    _load("fedpft_distill").main([*argv, "--results-dir", str(tmp_path)])
    results = json.loads((tmp_path / "distill-fedpft-tiny.json").read_text())["results"]
    curve = results["curves"]["0.001"]
    assert [p["steps"] for p in curve] == [1, 3] and 0 < results["start"] < 1
    assert all(_positive(p["error"]) and p["seconds"] >= 0 for p in curve)
    assert "| 3 | 0.001 |" in (tmp_path / "distill-fedpft-tiny.md").read_text()


def test_fedpft_distill_smoke_on_a_general_corpus_restarts_each_scheduled_checkpoint(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpft-tiny.yaml"
    sets = ["fedpft.distill_schedule=cosine", "fedpft.distill_warmup_ratio=0.2", "fedpft.distill_norms=true"]
    argv = [str(config), "--steps", "2", "4", "--public", "16", "--held-out", "4", "--lrs", "1e-3"]
    argv += ["--corpus", "all", "--tag", "general", "--results-dir", str(tmp_path)]
    _load("fedpft_distill").main([*argv, *(arg for key in sets for arg in ("--set", key))])
    results = json.loads((tmp_path / "distill-fedpft-tiny-general.json").read_text())["results"]
    curve = results["curves"]["0.001"]
    assert [p["steps"] for p in curve] == [2, 4] and all(_positive(p["error"]) for p in curve)
    text = (tmp_path / "distill-fedpft-tiny-general.md").read_text()
    assert "each row a distillation of its own" in text and "all (public splits)" in text
    assert "output norms trained" in text


def test_p12_smoke_scores_the_same_reading_each_prompt_once(tmp_path: Path) -> None:
    record = _load("choice_scoring").main(["--smoke", "--results-dir", str(tmp_path)])
    assert (tmp_path / "p12.smoke.md").read_text().startswith("# P12")
    for result in record["results"].values():
        assert result["max_abs_diff"] < 1e-4 and _positive(result["speedup"])
        assert result["same_acc"] == result["same_acc_norm"] == result["questions"]


def test_p1_p2_smoke_writes_both_results(tmp_path: Path) -> None:
    argv = ["--smoke", "--results-dir", str(tmp_path), "--sample", "20", "--repeats", "1"]
    _load("token_align").main(argv)
    p1 = json.loads((tmp_path / "p1.smoke.json").read_text())
    p2 = json.loads((tmp_path / "p2.smoke.json").read_text())
    assert all(row["identical"] for row in p1["directions"])
    assert all(row["identical"] for row in p2["samples"])


@pytest.mark.slow  # loopback Flower runs of a client each: 100 s in CI; the bench variants are checked below
def test_fedbiot_memory_measures_client_processes_on_flower(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    results_dir = tmp_path / "results"
    _load("fedbiot_memory").main([str(config), "--variants", "fedbiot_a2", "--results-dir", str(results_dir)])
    record = json.loads((results_dir / "memory-fedbiot-tiny.json").read_text())
    results = record["results"]
    assert set(results) == {"baseline", "fedbiot_a2"}
    # Every client process reported its own peak RSS, at least what importing the stack costs.
    measured = results["fedbiot_a2"]
    assert measured["client_peak_mem_mb"] >= 0.5 * results["baseline"]["client_peak_mem_mb"]
    assert measured["mb_down"] > 0
    params = measured["params"]
    assert 0 < params["client_params"] < params["full_params"]
    table = (results_dir / "memory-fedbiot-tiny.md").read_text()
    assert "FedBiOT adapter 2, emulator d=0.2" in table and "no model" in table


def test_fedmkt_memory_refuses_an_unknown_variant_before_measuring_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fedmkt_memory = _load("fedmkt_memory")
    config = str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml")

    def measured(*args: object) -> float:
        raise AssertionError("measured before the variants were checked")

    monkeypatch.setattr(fedmkt_memory, "baseline_mb", measured)
    with pytest.raises(SystemExit, match="unknown variant"):
        fedmkt_memory.main([config, "--variants", "slm:nope", "--results-dir", str(tmp_path)])


@pytest.mark.slow  # a client process of its own per variant: 80 s in CI; the unknown variant is refused above
def test_fedmkt_memory_measures_a_client_process_of_its_own(tmp_path: Path) -> None:
    fedmkt_memory = _load("fedmkt_memory")
    config = str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml")
    slm = yaml.safe_load((ROOT / "configs" / "test" / "fedmkt-tiny.yaml").read_text())["fedmkt"]["clients"][0]
    fedmkt_memory.main([config, "--variants", f"slm:{slm}", "--results-dir", str(tmp_path)])
    results = json.loads((tmp_path / "memory-fedmkt-tiny.json").read_text())["results"]
    assert results[f"slm:{slm}"]["client_peak_mem_mb"] > results["baseline"]["client_peak_mem_mb"] > 0
    assert f"| FedMKT: {slm} + LoRA |" in (tmp_path / "memory-fedmkt-tiny.md").read_text()


def test_memory_benchmarks_measure_the_paper_tables_rows() -> None:
    """The memory benchmarks name their rows' overrides themselves (bench/ imports nothing from
    experiments/): they must stay those of the paper tables."""
    from experiments import fedbiot_rows, perfit_table

    fedbiot = _load("fedbiot_memory").VARIANTS
    for variant, row in (("fedot", "fedot"), ("fedbiot_a2", "fedbiot_a2"), ("fedbiot_a4", "fedbiot_a4")):
        assert fedbiot[variant] == [*fedbiot_rows.METHODS[row], "fedbiot.dropout=0.2"]
    assert fedbiot["fedbiot_a2_d0.5"] == [*fedbiot_rows.METHODS["fedbiot_a2"], "fedbiot.dropout=0.5"]
    perfit = _load("perfit_memory").VARIANTS
    assert perfit["fit"] == perfit_table.ROWS["fit"]
    assert perfit["perfit"][: len(perfit_table.ROWS["perfit_s0.5"])] == perfit_table.ROWS["perfit_s0.5"]


@pytest.mark.slow  # three loopback Flower runs of a client each: ~2 min; the bench variants are checked below
def test_fedkseed_memory_measures_client_processes_on_flower(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedkseed-tiny.yaml"
    _load("fedkseed_memory").main([str(config), "--results-dir", str(tmp_path)])
    results = json.loads((tmp_path / "memory-fedkseed-tiny.json").read_text())["results"]
    assert set(results) == {"baseline", "fedit", "fedkseed", "fedkseed_undo"}
    for name in ("fedit", "fedkseed", "fedkseed_undo"):
        assert results[name]["client_peak_mem_mb"] >= 0.5 * results["baseline"]["client_peak_mem_mb"]
    # K = 8 scalars and seeds against a LoRA adapter: FedKSeed sends a fraction of FedIT's bytes
    assert 0 < results["fedkseed"]["kb_up"] < results["fedit"]["kb_up"]
    assert "FedKSeed, restore: undo" in (tmp_path / "memory-fedkseed-tiny.md").read_text()


def test_the_fedkseed_memory_variants_are_the_unequal_tables_rows() -> None:
    from experiments import unequal_rows

    variants = _load("fedkseed_memory").VARIANTS
    assert variants["fedit"] == ["algorithm=fedit", "fedkseed=null", *unequal_rows.ROWS["fedit"]]
    assert variants["fedkseed"] == unequal_rows.ROWS["fedkseed"]
    assert variants["fedkseed_undo"] == [*unequal_rows.ROWS["fedkseed"], "fedkseed.restore=undo"]


def test_p13_smoke_measures_every_k_against_the_exact_source(tmp_path: Path) -> None:
    _load("fedpt_http_topk").main(["--smoke", "--threads", "1", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "p13.smoke.json").read_text())
    assert (tmp_path / "p13.smoke.md").read_text().startswith("P13")
    assert record["smoke"] is True and record["vocab"] == 262
    kls = [record[k]["teacher"]["kl_large"] for k in ("5", "20", "128", "V")]
    assert kls[0] > kls[2] > 0 and abs(kls[3]) < 1e-5  # more named ids, closer; all of them, exact
    assert record["V"]["teacher"]["known_mass"] == pytest.approx(1.0)
    for k in ("5", "20", "128", "V"):
        assert _positive(record[k]["teacher"]["api_s_per_request"]) and _positive(
            record[k]["decoding"]["steps"]
        )


def test_secagg_smoke_measures_both_sides(tmp_path: Path) -> None:
    _load("secagg_overhead").main(["--smoke", "--results-dir", str(tmp_path)])
    record = json.loads((tmp_path / "secagg.smoke.json").read_text())
    assert (tmp_path / "secagg.smoke.md").read_text().startswith("SecAgg")
    (result,) = record["results"]
    assert result["clients"] == 4 and set(result["summary"]) == {"plain", "secure"}
    plain, secure = result["summary"]["plain"], result["summary"]["secure"]
    # Three of the four clients upload on both sides: as many masked vectors as updates (4 bytes a
    # value), and the keys, shares and unmasking on top.
    assert secure["bytes_up_per_client"] > plain["bytes_up_per_client"] > 3 * 4 * 1000 / 4
    assert _positive(result["secure_vs_plain"]["wall_s"])


@pytest.mark.slow  # a Ray instance and two actors: 140 s in CI; test_ray.py covers the backend itself
def test_p16_smoke_runs_in_process_and_on_ray(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    try:
        _load("ray_overhead").main(["--smoke", "--results-dir", str(tmp_path)])
    finally:
        ray.shutdown()
    record = json.loads((tmp_path / "p16.smoke.json").read_text())
    assert (tmp_path / "p16.smoke.md").read_text().startswith("P16")
    assert record["smoke"] is True and record["timed_rounds"] == [2]
    assert all(_positive(record["summary"]["round_seconds"][side]) for side in ("in_process", "ray"))
    # Reported, not required: the sides train on 2 threads and on 1, whose float sums may differ in
    # the last digits (test_ray.py compares the backends at equal threads).
    assert isinstance(record["same_metrics"], bool)
    on_ray = next(run for run in record["runs"] if run["side"] == "ray")
    assert set(on_ray["actor_peak_rss_mb"]) == {"actor0", "actor1"}


@pytest.mark.slow  # two Ray runs, each starting two actors: a minute on an idle machine
def test_p4_on_ray_smoke_measures_each_actor(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    try:
        _load("ray_memory").main(["--smoke", "--results-dir", str(tmp_path)])
    finally:
        ray.shutdown()
    record = json.loads((tmp_path / "p4-ray.smoke.json").read_text())
    assert (tmp_path / "p4-ray.smoke.md").read_text().startswith("P4 on Ray")
    assert set(record["peak_mb"]) == set(record["baseline_peak_mb"]) == {"actor0", "actor1"}
    # 20 clients over 2 actors: each holds 10 adapters, and the checkpoint says how large they are
    assert all(_positive(mb) for mb in record["held_adapter_mb"].values())


def test_p9_smoke_counts_the_flops_of_a_lora_step(tmp_path: Path) -> None:
    lora_mfu = _load("lora_mfu")
    record = lora_mfu.main(["--smoke", "--threads", "1", "--results-dir", str(tmp_path)])
    assert (tmp_path / "p9.smoke.md").read_text().startswith("P9")
    saved = json.loads((tmp_path / "p9.smoke.json").read_text())
    assert saved["smoke"] is True and saved["device"] == "cpu" and saved["mfu"]["model"] is None
    flops = record["flops_per_token"]
    # The frozen base skips its weight gradients: the executed count is below the model count.
    assert flops["executed"] < flops["model"] and _positive(record["tokens_per_s"])
    assert len(record["seconds_per_step"]) == 2
    # The ~1B model of the real run, by formula; the card table matches names as whole words.
    assert lora_mfu.param_counts(lora_mfu.FULL)["total"] == 953_223_168
    assert lora_mfu.peak_tflops("NVIDIA H200", None) == 989.0
    assert lora_mfu.peak_tflops("NVIDIA L40S", None) is None
    assert lora_mfu.peak_tflops("NVIDIA L4", None) == 121.0
    assert lora_mfu.peak_tflops("cpu", 1.5) == 1.5


def test_cli_startup_smoke_times_every_command(tmp_path: Path) -> None:
    cli_startup = _load("cli_startup")
    record = cli_startup.main(["--smoke", "--results-dir", str(tmp_path)])
    assert (tmp_path / "cli-startup.smoke.md").read_text().startswith("| command |")
    saved = json.loads((tmp_path / "cli-startup.smoke.json").read_text())
    assert saved["smoke"] is True and saved["repeats"] == 1 and set(saved["sources"]) == {"this"}
    timed = record["results"]["this"]
    assert set(timed) == set(cli_startup.COMMANDS)
    for label, numbers in timed.items():
        assert _positive(numbers["median_cpu_s"]) and _positive(numbers["median_wall_s"]), label
