"""FedPT on tiny random models: traffic boundaries, the cached teacher, baselines, alpha search."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedpt import FedPT, kd_loss
from fedtune.algorithms.fedpt.distillation import frozen_teacher
from fedtune.eval.evaluate import EvalSet
from fedtune.fl.payload import Payload
from fedtune.models.loading import load_causal_lm
from fedtune.progress import RunProgress
from fedtune.proxy import VocabMismatch, proxy_logits
from fedtune.train.losses import labelled_logits
from fedtune.train.teacher_cache import TeacherCache
from tests.integration.helpers import quiet_runner, stable, tiny_config


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def test_no_large_model_weight_and_only_small_lora_on_the_wire(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt")
    seen: list[tuple[str, Payload]] = []
    quiet_runner(cfg, tmp_path / "run", tap=lambda d, c, t, r, p: seen.append((d, p))).run()
    assert {d for d, _ in seen} == {"down", "up"}
    large, _ = load_causal_lm(cfg.fedpt.large_model, seed=cfg.seed)
    large_digests = {_digest(p.detach().numpy()) for p in large.parameters()}
    large_shapes = {tuple(p.shape) for p in large.parameters()}
    initial = json.loads((tmp_path / "run" / "artifacts" / "adapter" / "adapter_config.json").read_text())
    assert initial["r"] == cfg.lora.r
    for direction, payload in seen:
        arrays = {k: v for k, v in payload.items() if isinstance(v, np.ndarray)}
        assert arrays, direction
        for key, value in arrays.items():
            assert key.startswith("adapter/"), key
            assert "lora_" in key, key
            assert _digest(value) not in large_digests, key
            # LoRA factors are [r, in] or [out, r]: never a whole weight matrix of the large model.
            assert cfg.lora.r in value.shape and tuple(value.shape) not in large_shapes, key


def _built(cfg: Any, run_dir: Path) -> tuple[FedPT, Any, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = quiet_runner(cfg, run_dir)
    with RunProgress(runner.console, 1, enabled=False) as progress:
        algorithm, fed, server = runner._build(progress)
    assert isinstance(algorithm, FedPT)
    algorithm.setup(server)
    return algorithm, fed, server


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_cached_teacher_plus_alpha_times_tuned_is_the_proxy(tmp_path: Path, dtype: str) -> None:
    cfg = tiny_config("fedpt", "fedpt.alpha=1.5", f"fedpt.teacher_dtype={dtype}")
    algorithm, _, server = _built(cfg, tmp_path / "run")
    model, _ = server.resources.lora_lm()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    batch = algorithm._kd_batches[0]
    large = algorithm.large(server)
    cache = algorithm._teacher_cache(1.5)
    frozen = cache.get(0, lambda: frozen_teacher(model, large, batch, 1.5, algorithm.vocab_width))
    with torch.inference_mode():
        tuned, _ = labelled_logits(model, batch)
        with model.disable_adapter():
            base, _ = labelled_logits(model, batch)
    expected = proxy_logits(large.labelled_logits(batch), tuned, base, 1.5, algorithm.vocab_width)
    tolerance = 1e-4 if dtype == "fp32" else 2e-2
    torch.testing.assert_close(frozen + 1.5 * tuned.float(), expected, atol=tolerance, rtol=0)
    # Served from disk the second time, identical to the first.
    again = cache.get(0, lambda: pytest.fail("recomputed a cached teacher"))  # type: ignore[arg-type]
    torch.testing.assert_close(again, frozen)


def test_teacher_is_computed_once_per_run_and_reused_on_resume(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt", "fed.rounds=3", "eval.every=10", "eval.before=false")
    history = quiet_runner(cfg, tmp_path / "run").run()
    seconds = [row["teacher_seconds"] for row in history[1:]]
    assert seconds[0] > 0 and seconds[1:] == [0.0, 0.0]
    files = sorted((tmp_path / "run" / "cache" / "fedpt-teacher").glob("batch*.npy"))
    assert len(files) == 2  # 16 public examples in batches of 8
    cache = TeacherCache("disk", tmp_path / "run" / "cache" / "fedpt-teacher", {"other": 1}, "fp16")
    assert not list(cache.directory.glob("batch*.npy")), "a different fingerprint must clear the cache"


def test_cache_modes_agree(tmp_path: Path) -> None:
    runs = {
        mode: quiet_runner(
            tiny_config(
                "fedpt", f"fedpt.teacher_cache={mode}", "fedpt.teacher_dtype=fp32", "eval.before=false"
            ),
            tmp_path / mode,
        ).run()
        for mode in ("recompute", "memory", "disk")
    }
    losses = {mode: [row.get("kd_ce") for row in rows] for mode, rows in runs.items()}
    assert losses["recompute"] == losses["memory"] == losses["disk"]
    assert "cache" not in {p.name for p in (tmp_path / "recompute").iterdir()}


def _kd_texts(algorithm: FedPT) -> set[tuple[int, ...]]:
    return {
        tuple(ids[mask.bool()].tolist())
        for batch in algorithm._kd_batches
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    }


def test_the_public_set_can_be_another_dataset(tmp_path: Path) -> None:
    """``fedpt.public_dataset``: the proxy is distilled on that dataset's public split (a shifted public
    set), and the teacher cache is keyed by it; a bad name is an error naming the key."""
    from fedtune.data.builtin import load_builtin
    from fedtune.data.records import DataError
    from fedtune.data.tokenize import encode_records

    shifted = tiny_config("fedpt", "fedpt.public_dataset=arith-word-problems")
    algorithm, _, server = _built(shifted, tmp_path / "shifted")
    _, tokenizer = server.resources.lora_lm()
    data = shifted.data
    public = load_builtin("arith-word-problems", "public")
    arith = encode_records(public, tokenizer, data.template, data.max_length)
    texts = _kd_texts(algorithm)
    assert len(texts) == shifted.fedpt.kd_examples and texts <= {tuple(ex.input_ids) for ex in arith}
    default, _, _ = _built(tiny_config("fedpt"), tmp_path / "default")
    assert not texts & _kd_texts(default)
    meta = json.loads((algorithm._teacher_cache(shifted.fedpt.alpha).directory / "meta.json").read_text())
    assert meta["public_dataset"] == "arith-word-problems"
    with pytest.raises(DataError, match=r"fedpt\.public_dataset: .*arith-word-problem"):
        _built(tiny_config("fedpt", "fedpt.public_dataset=arith-word-problem"), tmp_path / "bad")


def test_fedavg_pt_baseline_does_not_distil(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt", "fedpt.distill=false", "eval.before=false")
    history = quiet_runner(cfg, tmp_path / "run").run()
    assert all("kd_ce" not in row for row in history)
    assert not (tmp_path / "run" / "cache").exists()


def test_distillation_moves_the_student_towards_the_teacher(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt", "fedpt.kd_steps=12", "fedpt.kd_lambda=1.0", "fedpt.kd_lr=0.05")
    algorithm, _, server = _built(cfg, tmp_path / "run")
    adapter = dict(server.resources.initial_adapter())
    _, first = algorithm._distill(1, server, adapter)
    cfg_one = tiny_config("fedpt", "fedpt.kd_steps=1", "fedpt.kd_lambda=1.0", "fedpt.kd_lr=0.05")
    algorithm_one, _, server_one = _built(cfg_one, tmp_path / "one")
    _, one = algorithm_one._distill(1, server_one, dict(server_one.resources.initial_adapter()))
    assert first["kd_kl"] < one["kd_kl"]


def test_distillation_does_not_depend_on_the_global_torch_rng(tmp_path: Path) -> None:
    # LoRA dropout draws from torch's global RNG during KD. In simulation the clients' SFT ran just
    # before in the same process, on Flower the ServerApp ran nothing: the backends must agree.
    cfg = tiny_config("fedpt")
    assert cfg.lora.dropout > 0
    algorithm, _, server = _built(cfg, tmp_path / "run")
    adapter = dict(server.resources.initial_adapter())
    results = []
    for state in (1, 2):
        torch.manual_seed(state)
        results.append(algorithm._distill(1, server, adapter)[0])
    assert results[0].keys() == results[1].keys()
    for key, value in results[0].items():
        np.testing.assert_array_equal(value, results[1][key], err_msg=key)


def test_kd_loss_matches_the_formula() -> None:
    torch.manual_seed(0)
    student = torch.randn(5, 12, requires_grad=True)
    teacher = torch.randn(5, 10)
    targets = torch.randint(0, 12, (5,))
    loss, ce, kl = kd_loss(student, targets, teacher, 0.25, 10)
    p_teacher = teacher.softmax(-1)
    manual_kl = (p_teacher * (p_teacher.log() - student[:, :10].log_softmax(-1))).sum(-1).mean().detach()
    manual_ce = torch.nn.functional.cross_entropy(student, targets).detach()
    torch.testing.assert_close(loss, 0.75 * manual_ce + 0.25 * manual_kl)
    assert ce == pytest.approx(manual_ce.item(), rel=1e-5)
    assert kl == pytest.approx(manual_kl.item(), rel=1e-5)


def test_alpha_is_searched_on_validation_and_saved(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt", "fedpt.alpha_grid=[0.0,1.0,2.0]")
    history = quiet_runner(cfg, tmp_path / "run").run()
    final = history[-1]["eval"]
    study = {k.split("/")[1]: v for k, v in final.items() if k.startswith("alpha_study/")}
    assert set(study) == {"0", "1", "2"}
    assert final["alpha"] == float(max(study, key=lambda a: study[a]))
    saved = json.loads((tmp_path / "run" / "artifacts" / "proxy.json").read_text())
    assert saved["alpha"] == final["alpha"] and saved["large_model"] == cfg.fedpt.large_model
    assert "small/rougeL" in final and "alpha_study/1" not in history[1].get("eval", {})


def test_alpha_can_be_picked_by_validation_perplexity_without_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.proxy import ProxyTunedLM

    searching: list[bool] = []
    generate = ProxyTunedLM.generate

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        searching.append(True)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(ProxyTunedLM, "generate", counted)
    overrides = ["fedpt.alpha_grid=[0.0,1.0,2.0]", "fedpt.alpha_search_metric=perplexity"]
    cfg = tiny_config("fedpt", *overrides, "eval.metrics=[perplexity]")
    history = quiet_runner(cfg, tmp_path / "run").run()
    final = history[-1]["eval"]
    study = {k.split("/")[1]: v for k, v in final.items() if k.startswith("alpha_study/")}
    assert set(study) == {"0", "1", "2"} and all(value > 1.0 for value in study.values())  # perplexities
    assert final["alpha"] == float(min(study, key=lambda a: study[a]))
    assert not searching  # neither the search nor a perplexity-only evaluation decodes


def test_perplexity_at_several_alphas_runs_each_model_once_a_batch(tmp_path: Path) -> None:
    import torch.nn.functional as F

    from fedtune.algorithms.fedpt.final import load_proxy_model, proxy_perplexities
    from fedtune.eval.evaluate import perplexity_batches
    from fedtune.eval.metrics import perplexity_from_nll
    from fedtune.rundata import prepare_data

    quiet_runner(tiny_config("fedpt", "fed.rounds=1"), tmp_path / "run").run()
    proxy, cfg = load_proxy_model(tmp_path / "run")
    records = prepare_data(cfg).eval_records
    settings = cfg.eval.model_copy(update={"metrics": ["perplexity"], "batch_size": 2})
    where = {"template": cfg.data.template, "max_length": cfg.data.max_length}
    batches = perplexity_batches(records, proxy.tokenizer, settings, **where)
    alphas = [0.0, 0.5, 2.0]
    expected = {}
    for alpha in alphas:  # one alpha at a time, through the proxy's own logits
        nll, tokens = 0.0, 0
        for batch in batches:
            logits = proxy.labelled_logits(batch, alpha=alpha)
            targets = batch["labels"][:, 1:][batch["labels"][:, 1:] != -100]
            nll += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            tokens += int(targets.numel())
        expected[alpha] = float(perplexity_from_nll(nll, tokens))
    large_calls: list[int] = []
    labelled = proxy.large.labelled_logits
    proxy.large.labelled_logits = lambda batch: large_calls.append(1) or labelled(batch)  # type: ignore[method-assign]
    together = proxy_perplexities(proxy, proxy.tokenizer, records, alphas, settings, **where)
    assert together == expected
    assert len(large_calls) == len(batches) > 1  # not once per alpha
    assert len(set(together.values())) == len(alphas)


def test_round_zero_is_the_base_large_model(tmp_path: Path) -> None:
    """LoRA B starts at zero, so tuned == base and the proxy is the large model itself."""
    from fedtune.decode.generate import generate_texts
    from fedtune.rundata import prepare_data

    cfg = tiny_config("fedpt", "fed.rounds=1", "eval.metrics=[rougeL]")
    algorithm, fed, server = _built(cfg, tmp_path / "run")
    proxy_result = algorithm.evaluate(0, server, fed, EvalSet("", server.eval_records))
    large, tokenizer = load_causal_lm(cfg.fedpt.large_model, seed=cfg.seed)
    from fedtune.data.templates import build_prompt

    records = prepare_data(cfg).eval_records
    prompts = [build_prompt(r, cfg.data.template, tokenizer) for r in records]
    texts = generate_texts(large, tokenizer, prompts, max_new_tokens=cfg.eval.max_new_tokens)
    from fedtune.eval.metrics import mean, rouge_l

    assert proxy_result.metrics["rougeL"] == pytest.approx(mean(rouge_l(texts, [r.output for r in records])))


def test_vocabulary_mismatch_is_an_error_before_training(tmp_path: Path, monkeypatch: Any) -> None:
    import fedtune.algorithms.fedpt.server as fedpt_module

    def mismatch(*args: Any, **kwargs: Any) -> int:
        raise VocabMismatch("differ")

    monkeypatch.setattr(fedpt_module, "shared_vocab_size", mismatch)
    cfg = tiny_config("fedpt")
    calls: list[str] = []
    with pytest.raises(VocabMismatch):
        quiet_runner(cfg, tmp_path / "run", before_task=lambda c, t, r: calls.append(c)).run()
    assert calls == []


def test_resume_keeps_the_teacher_cache_and_equals_uninterrupted(tmp_path: Path) -> None:
    cfg = tiny_config("fedpt", "fed.rounds=3", "eval.every=10", "eval.before=false")
    full = quiet_runner(cfg, tmp_path / "full").run()

    class Stop(BaseException):
        pass

    def die(client: str, task: str, rnd: int) -> None:
        if rnd == 3:
            raise Stop

    with pytest.raises(Stop):
        quiet_runner(cfg, tmp_path / "cut", before_task=die).run()
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    assert stable(resumed) == stable(full)
    assert resumed[-1]["teacher_seconds"] == 0.0


def test_distillation_has_its_own_optimiser_settings(tmp_path: Path) -> None:
    def final_adapter(name: str, *overrides: str) -> dict[str, np.ndarray]:
        cfg = tiny_config("fedpt", "fed.rounds=1", "eval.before=false", *overrides)
        quiet_runner(cfg, tmp_path / name).run()
        from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint

        return load_checkpoint(latest_checkpoint(tmp_path / name))["algorithm"]["global_adapter"]  # type: ignore[arg-type,no-any-return]

    default = final_adapter("default")
    # Client training clipped to nothing moves the clients' adapters, so compare KD settings only.
    kd_clipped = final_adapter("kd-clip", "fedpt.kd_clip_norm=1e-6")
    kd_warm = final_adapter("kd-warmup", "fedpt.kd_warmup_ratio=0.5")
    assert any(not np.array_equal(default[k], kd_clipped[k]) for k in default)
    assert any(not np.array_equal(default[k], kd_warm[k]) for k in default)


def test_the_output_is_alg1s_proxy_of_the_aggregate_before_its_distillation(tmp_path: Path) -> None:
    """Alg. 1 (l.9) builds the proxy from the round's FedAvg aggregate, before that round's distillation:
    that small model is what is evaluated (``small/``, and the proxy over it) and the final model; the
    small model after the distillation (what the clients are sent next) is the variant ``*-distilled``."""
    from fedtune.artifacts import load_final
    from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
    from fedtune.models.lora import adapter_arrays
    from fedtune.rundata import prepare_data

    cfg = tiny_config("fedpt", "fed.rounds=1", "eval.before=false", "fedpt.eval_distilled=true")
    uploads: list[Payload] = []
    tap = lambda d, c, t, r, p: uploads.append(p) if d == "up" else None  # noqa: E731
    history = quiet_runner(cfg, tmp_path / "run", tap=tap).run()

    weights = [int(p["num_examples"]) for p in uploads]
    keys = [k for k in uploads[0] if k.startswith("adapter/")]
    aggregate = {
        k.split("/", 1)[1]: np.average([p[k] for p in uploads], axis=0, weights=weights) for k in keys
    }
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "run"))  # type: ignore[arg-type]
    distilled = checkpoint["algorithm"]["global_adapter"]
    assert any(not np.allclose(distilled[k], v) for k, v in aggregate.items())  # the distillation moved it

    small = load_final(tmp_path / "run", variant="small")
    held = adapter_arrays(small.model)  # type: ignore[attr-defined]
    for key, value in aggregate.items():
        np.testing.assert_allclose(held[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    records = prepare_data(cfg).eval_records
    small_ppl = small.evaluate(records).metrics["perplexity"]
    assert small_ppl == pytest.approx(history[-1]["eval"]["small/perplexity"], rel=1e-5)

    after = load_final(tmp_path / "run", variant="small-distilled")
    held = adapter_arrays(after.model)  # type: ignore[attr-defined]
    for key, value in distilled.items():
        np.testing.assert_allclose(held[key], value, rtol=1e-6, atol=1e-8, err_msg=key)
    final = history[-1]["eval"]
    assert after.evaluate(records).metrics["perplexity"] == pytest.approx(
        final["distilled/small/perplexity"], rel=1e-5
    )
    proxy = load_final(tmp_path / "run", variant="proxy-distilled")
    assert proxy.evaluate(records).metrics["perplexity"] == pytest.approx(
        final["distilled/perplexity"], rel=1e-4
    )


def test_alpha_search_metric_that_cannot_score_the_proxy_is_a_config_error() -> None:
    from fedtune.config import ConfigError

    with pytest.raises(ConfigError, match="alpha_search_metric"):
        tiny_config("fedpt", "fedpt.alpha_search_metric=acc")


# fedpt.alpha off the grid, so the teacher's alpha says which one it is; a search every eval round.
EVERY_ROUND_SEARCH = (
    "fedpt.alpha=0.7",
    "fedpt.alpha_grid=[0.5,1.0]",
    "fedpt.alpha_search=every",
    "fedpt.alpha_search_metric=perplexity",
    "eval.metrics=[perplexity]",
)


@pytest.mark.parametrize("teacher_alpha", ["searched", "fixed"])
def test_the_teacher_follows_the_latest_searched_alpha_unless_fixed(
    teacher_alpha: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fedtune.algorithms.fedpt.server as fedpt_module

    proxy_alphas: list[float] = []
    frozen_alphas: list[float] = []
    proxy_teacher, frozen_teacher = fedpt_module.proxy_teacher, fedpt_module.frozen_teacher

    def proxy_spy(frozen: Any, z_tuned: Any, alpha: float, width: int) -> Any:
        proxy_alphas.append(alpha)
        return proxy_teacher(frozen, z_tuned, alpha, width)

    def frozen_spy(model: Any, large: Any, batch: Any, alpha: float, width: int) -> Any:
        frozen_alphas.append(alpha)
        return frozen_teacher(model, large, batch, alpha, width)

    monkeypatch.setattr(fedpt_module, "proxy_teacher", proxy_spy)
    monkeypatch.setattr(fedpt_module, "frozen_teacher", frozen_spy)
    overrides = () if teacher_alpha == "searched" else (f"fedpt.teacher_alpha={teacher_alpha}",)  # default
    cfg = tiny_config("fedpt", *EVERY_ROUND_SEARCH, *overrides)
    history = quiet_runner(cfg, tmp_path / "run").run()
    searched = history[1]["eval"]["alpha"]
    assert searched in cfg.fedpt.alpha_grid and "alpha_study/0.5" in history[1]["eval"]
    steps = cfg.fedpt.kd_steps
    # Round 1 distils before any search: fedpt.alpha; round 2 after round 1's search.
    second = searched if teacher_alpha == "searched" else cfg.fedpt.alpha
    assert proxy_alphas == [cfg.fedpt.alpha] * steps + [second] * steps
    # The frozen part C = z_l0 - alpha z_s0 is computed (and cached) at the teacher's alpha.
    assert set(frozen_alphas) == {cfg.fedpt.alpha, second}


def test_resume_after_a_search_equals_uninterrupted(tmp_path: Path) -> None:
    from tests.integration.test_contract import Interrupt

    cfg = tiny_config("fedpt", *EVERY_ROUND_SEARCH, "fed.rounds=3")
    full = quiet_runner(cfg, tmp_path / "full").run()

    def die_in_round_3(client: str, task: str, rnd: int) -> None:
        if rnd == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_3).run()
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    assert stable(resumed) == stable(full)
