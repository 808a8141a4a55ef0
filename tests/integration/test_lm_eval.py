"""``fedtune eval --harness lm-eval``: the fedtune model in EleutherAI's lm-evaluation-harness.

It must score as lm-eval's own ``hf`` model on the same weights (a merged FedIT export), agree with
fedtune's own choice accuracy on the same prompts, and run for every method's final model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import ExperimentConfig
from tests.integration.helpers import quiet_runner, tiny_config

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from lm_eval.api.instance import Instance

from fedtune.algorithms.final import FinalModelError, load_adapter_model
from fedtune.harness import RESULTS_FILE, TASKS_DIR_NAME, HarnessError, run_harness
from fedtune.harness.model import FedtuneLM
from fedtune.harness.tasks import export_tasks

TASK = "fedtune-wordnet-wic"
DOCS = 6


@pytest.fixture(scope="module")
def fedit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentConfig, Path]:
    cfg = tiny_config("fedit", "fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]")
    run_dir = tmp_path_factory.mktemp("fedit") / "run"
    quiet_runner(cfg, run_dir).run()
    return cfg, run_dir


def exported_docs(run_dir: Path, cfg: ExperimentConfig, name: str) -> list[dict[str, Any]]:
    final = load_adapter_model(cfg, run_dir)
    directory = export_tasks(run_dir / "tasks-for-test", final.prompt, [f"fedtune-{name}"])
    lines = (directory / "data" / f"{name}.jsonl").read_text().splitlines()[:DOCS]
    return [json.loads(line) for line in lines]


def requests(kind: str, arguments: list[tuple[Any, ...]]) -> list[Instance]:
    return [Instance(kind, {}, args, index) for index, args in enumerate(arguments)]


def test_the_wrapper_scores_as_lm_evals_hf_model_on_the_merged_export(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    from lm_eval.models.huggingface import HFLM

    from fedtune.export import export_run

    cfg, run_dir = fedit_run
    export_run(run_dir, "merged", tmp_path / "merged")
    hf = HFLM(pretrained=str(tmp_path / "merged"), device="cpu", batch_size=4, dtype="float32")
    ours = FedtuneLM(run_dir=str(run_dir), batch_size=3)
    docs = exported_docs(run_dir, cfg, "wordnet-wic")
    pairs = [(doc["prompt"], choice) for doc in docs for choice in doc["choices"]]
    pairs += [("", "a word"), ("Define 'harbor'. ", "a sheltered port")]  # empty context; moved space
    theirs_ll, ours_ll = (
        hf.loglikelihood(requests("loglikelihood", pairs)),
        ours.loglikelihood(requests("loglikelihood", pairs)),
    )
    texts = [(doc["prompt"] + doc["output"],) for doc in docs]
    theirs_rolling = hf.loglikelihood_rolling(requests("loglikelihood_rolling", texts))
    ours_rolling = ours.loglikelihood_rolling(requests("loglikelihood_rolling", texts))

    assert [greedy for _, greedy in ours_ll] == [greedy for _, greedy in theirs_ll]
    assert [score for score, _ in ours_ll] == pytest.approx([score for score, _ in theirs_ll], abs=1e-4)
    # A random model's whole-text log-likelihoods reach -2000: one float32 step there is 2.4e-4, so the
    # two float32 sums (in different orders) agree to a float32 step, not to 1e-4.
    assert ours_rolling == pytest.approx(theirs_rolling, rel=1e-6, abs=1e-4)


def test_the_choice_task_equals_fedtunes_own_choice_accuracy(
    fedit_run: tuple[ExperimentConfig, Path],
) -> None:
    from fedtune.data.builtin import load_builtin
    from fedtune.eval.evaluate import evaluate_choices

    cfg, run_dir = fedit_run
    scores = run_harness(run_dir, [TASK], max_examples=DOCS)
    final = load_adapter_model(cfg, run_dir)
    settings = cfg.eval.model_copy(update={"metrics": ["acc", "acc_norm"]})
    records = load_builtin("wordnet-wic", "test")[:DOCS]
    # max_length=None: fedtune's eval cuts prompts to data.max_length as training does; lm-eval to the
    # model's context. With the same cut the two read the same tokens.
    own = evaluate_choices(final.model, final.tokenizer, records, settings, template=cfg.data.template)

    assert scores[TASK]["acc"] == pytest.approx(own.metrics["acc"])
    assert scores[TASK]["acc_norm"] == pytest.approx(own.metrics["acc_norm"])
    saved = json.loads((run_dir / RESULTS_FILE).read_text())
    assert saved["scores"] == scores and saved["max_examples"] == DOCS
    exported = {path.name for path in (run_dir / TASKS_DIR_NAME).glob("*.yaml")}
    assert f"{TASK}.yaml" in exported and "fedtune-stdlib-code.yaml" not in exported  # only those asked for


def test_lm_eval_builds_the_registered_fedtune_model_from_its_arguments(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    cfg, run_dir = fedit_run
    include = export_tasks(tmp_path, load_adapter_model(cfg, run_dir).prompt, [TASK])
    output = lm_eval.simple_evaluate(
        model="fedtune",
        model_args=f"run_dir={run_dir}",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        limit=2,
        device="cpu",
        batch_size="auto",
    )
    assert output is not None and 0.0 <= output["results"][TASK]["acc,none"] <= 1.0


def test_a_generation_task_scores_with_fedtunes_metrics(fedit_run: tuple[ExperimentConfig, Path]) -> None:
    _, run_dir = fedit_run
    scores = run_harness(run_dir, ["fedtune-arith-word-problems"], max_examples=2)
    assert set(scores["fedtune-arith-word-problems"]) >= {"rougeL", "exact_match", "numeric_accuracy"}


def test_an_unknown_task_is_refused_with_the_closest_name(fedit_run: tuple[ExperimentConfig, Path]) -> None:
    _, run_dir = fedit_run
    with pytest.raises(
        HarnessError, match="no task 'fedtune-wordnet-wc'; did you mean 'fedtune-wordnet-wic'"
    ):
        run_harness(run_dir, ["fedtune-wordnet-wc"], max_examples=2)


def test_a_task_whose_data_is_unreachable_is_a_clear_error(
    fedit_run: tuple[ExperimentConfig, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval

    def offline(**kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)")

    _, run_dir = fedit_run
    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    with pytest.raises(HarnessError, match=r"ai2_arc' on the Hub .*fedtune-<set> tasks run offline"):
        run_harness(run_dir, [TASK], max_examples=2)


METHODS = [
    ("fedavgm", None, {}),
    ("fedbiot", "adapfu", {}),
    ("fedbiot", "adapemu", {}),
    ("fedpt", "proxy", {}),
    ("fedpt", "small", {}),
    ("fedmkt", None, {}),
    ("fedmkt", None, {"client": "c01"}),
    ("perfit", None, {"client": "c00"}),
]


@pytest.fixture(scope="module")
def method_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished tiny run per method, made on first use."""
    return {}


def method_run(method_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, method: str) -> Path:
    if method not in method_runs:
        cfg = tiny_config(method, "fed.rounds=1", "eval.before=false")
        run_dir = tmp_path_factory.mktemp(method) / "run"
        quiet_runner(cfg, run_dir).run()
        method_runs[method] = run_dir
    return method_runs[method]


@pytest.mark.parametrize(("method", "variant", "options"), METHODS, ids=lambda value: str(value))
def test_every_methods_final_model_scores_a_task(
    method_runs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    method: str,
    variant: str | None,
    options: dict[str, str],
) -> None:
    run_dir = method_run(method_runs, tmp_path_factory, method)
    scores = run_harness(run_dir, [TASK], max_examples=2, variant=variant, options=options)
    assert 0.0 <= scores[TASK]["acc"] <= 1.0


def test_fedpts_proxy_scores_text_by_the_combined_logits_at_the_chosen_alpha(
    method_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import torch

    from fedtune.artifacts import load_final
    from fedtune.harness.model import labelled_batch
    from fedtune.proxy.arith import proxy_logits

    run_dir = method_run(method_runs, tmp_path_factory, "fedpt")
    final: Any = load_final(run_dir, "proxy", {"alpha": "2.0"})
    model = FedtuneLM(final=final)
    context, continuation = model.tok_encode("Define 'harbor'.\n"), model.tok_encode("a sheltered port")
    ((score, _),) = model._loglikelihood_tokens([(("", ""), context, continuation)])
    large, tuned, base = final.proxy.labelled_parts(labelled_batch([(context, continuation)], 0))
    targets = torch.tensor(continuation)[:, None]

    def summed(logits: torch.Tensor) -> float:
        return float(torch.log_softmax(logits.float(), dim=-1).gather(-1, targets).sum())

    width = final.proxy.vocab_width
    assert score == pytest.approx(summed(proxy_logits(large, tuned, base, 2.0, width)), abs=1e-4)
    assert score != pytest.approx(summed(large[:, :width]), abs=1e-3)  # the small models steer it


def test_fedpfts_classifier_scores_its_class_task_as_its_own_accuracy_and_refuses_text(
    method_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from fedtune.algorithms.fedpft.final import evaluate_final_fedpft
    from fedtune.artifacts import run_config
    from fedtune.data.builtin import load_builtin

    run_dir = method_run(method_runs, tmp_path_factory, "fedpft")
    # 128 documents: the tiny classifier after one round gets a few right (5), so a mismatch would show
    scores = run_harness(run_dir, ["fedtune-wordnet-lexclass"], max_examples=128)
    records = load_builtin("wordnet-lexclass", "test")[:128]
    own = evaluate_final_fedpft(run_config(run_dir), run_dir, records)

    assert own.metrics["accuracy"] > 0
    assert scores["fedtune-wordnet-lexclass"]["acc"] == pytest.approx(own.metrics["accuracy"])
    with pytest.raises(FinalModelError, match="which is none of them: it scores only multiple-choice tasks"):
        run_harness(run_dir, [TASK], max_examples=2)
    with pytest.raises(FinalModelError, match="does not generate text"):
        run_harness(run_dir, ["fedtune-wordnet-instruct"], max_examples=2)


def test_the_command_lists_tasks_scores_a_client_and_refuses_an_unknown_harness(
    fedit_run: tuple[ExperimentConfig, Path],
) -> None:
    from typer.testing import CliRunner

    from fedtune.cli import app

    _, run_dir = fedit_run
    runner = CliRunner()
    listed = runner.invoke(app, ["eval", str(run_dir), "--harness", "lm-eval", "--tasks", "list"])
    scored = runner.invoke(
        app, ["eval", str(run_dir), "--harness", "lm-eval", "--tasks", TASK, "--max-examples", "2"]
    )
    unknown = runner.invoke(app, ["eval", str(run_dir), "--harness", "helm", "--tasks", TASK])
    split = runner.invoke(
        app, ["eval", str(run_dir), "--harness", "lm-eval", "--tasks", TASK, "--split", "x"]
    )
    client = runner.invoke(
        app, ["eval", str(run_dir), "--harness", "lm-eval", "--tasks", TASK, "--client", "c01"]
    )

    assert listed.exit_code == 0 and TASK in listed.stdout.splitlines()
    assert "hellaswag" in listed.stdout.splitlines()  # lm-eval's own tasks pass through by name
    assert scored.exit_code == 0 and "acc_norm" in scored.stdout
    assert unknown.exit_code == 2 and "the one harness is lm-eval" in unknown.output
    assert split.exit_code == 2 and "lm-eval tasks name their split" in split.output
    assert client.exit_code == 2 and "has no option client" in client.output
