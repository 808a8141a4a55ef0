"""``fedtune export``: a tiny FedIT run's final model as a peft adapter and as a merged transformers
model that load with peft / transformers alone and score the run's perplexity; GGUF through a
converter named on the command line or fetched from llama-cpp-python's sdist; clear refusals."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedtune.algorithms.exporting import ExportError
from fedtune.algorithms.final import CausalLMModel, FinalModelError, load_base_model
from fedtune.artifacts import evaluate_run, load_final
from fedtune.cli import app
from fedtune.config import ExperimentConfig
from fedtune.export import CONVERTER_ENV, GGUF_FILE, INFO_FILE, export_run
from fedtune.files import current_umask
from fedtune.models import llama_cpp
from fedtune.models.zoo import ZooError
from fedtune.rundata import prepare_data
from tests.integration.helpers import (
    LLAMA_SDIST_TOP,
    fake_llama_sdist,
    pin_fake_llama_sdist,
    quiet_runner,
    tiny_config,
)


@pytest.fixture(scope="module")
def fedit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentConfig, Path]:
    cfg = tiny_config("fedit", "fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]")
    run_dir = tmp_path_factory.mktemp("fedit") / "run"
    quiet_runner(cfg, run_dir).run()
    return cfg, run_dir


def test_a_merged_export_loads_with_transformers_and_scores_the_runs_perplexity(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Execute
    cfg, run_dir = fedit_run
    result = export_run(run_dir, "merged", tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    records = prepare_data(cfg).eval_records
    exported = CausalLMModel(cfg, model, tokenizer).evaluate(records).metrics["perplexity"]
    expected = evaluate_run(run_dir).metrics["perplexity"]

    # Assert: no LoRA module left, the run's perplexity
    assert not any("lora_" in name for name, _ in model.named_parameters())
    assert exported == pytest.approx(expected, rel=1e-4)
    assert "merged into the weights" in result.what
    info = json.loads((tmp_path / "merged" / INFO_FILE).read_text())
    assert info["algorithm"] == "fedit" and info["format"] == "merged" and info["base_model"] == "tiny-llama"


def test_a_peft_export_loads_with_peft_on_the_base_model(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    from peft import PeftModel

    cfg, run_dir = fedit_run
    export_run(run_dir, "peft", tmp_path / "peft")
    base, tokenizer = load_base_model(cfg)
    model = PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    records = prepare_data(cfg).eval_records

    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (tmp_path / "peft").iterdir()
    }
    assert CausalLMModel(cfg, model, tokenizer).evaluate(records).metrics["perplexity"] == pytest.approx(
        evaluate_run(run_dir).metrics["perplexity"], rel=1e-4
    )


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.rglob("*") if p.is_file()}


def test_the_runs_adapter_names_its_base_model_and_carries_the_runs_card(
    fedit_run: tuple[ExperimentConfig, Path],
) -> None:
    _, run_dir = fedit_run
    adapter = run_dir / "artifacts" / "adapter"

    config = json.loads((adapter / "adapter_config.json").read_text())
    card = (adapter / "README.md").read_text()

    assert config["base_model_name_or_path"] == "tiny-llama"  # was null
    assert "# fedit-tiny: a LoRA adapter (peft)" in card and "Model Card for Model ID" not in card
    assert set(_modes(run_dir / "artifacts").values()) == {0o666 & ~current_umask()}


@pytest.mark.parametrize("fmt", ["peft", "merged"])
def test_an_export_carries_the_runs_card_and_files_anyone_may_read(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path, fmt: str
) -> None:
    # Prepare: an adapter saved before the base was named (as runs made before this change have it)
    _, run_dir = fedit_run
    saved = run_dir / "artifacts" / "adapter" / "adapter_config.json"
    original = saved.read_text()
    saved.write_text(json.dumps({**json.loads(original), "base_model_name_or_path": None}))

    # Execute
    try:
        export_run(run_dir, fmt, tmp_path / fmt)
    finally:
        saved.write_text(original)

    # Assert: the card (not peft's template), the base named, every file 0666 less the umask
    card = (tmp_path / fmt / "README.md").read_text()
    library = {"peft": "peft", "merged": "transformers"}[fmt]
    assert f"library_name: {library}" in card and "**fedit**: 1 of 1 rounds" in card
    assert "## Final metrics (round 1)" in card and "Model Card for Model ID" not in card
    if fmt == "peft":
        config = json.loads((tmp_path / fmt / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "tiny-llama"
    modes = _modes(tmp_path / fmt)
    assert any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {0o666 & ~current_umask()}


def test_gguf_runs_the_named_converter_on_the_merged_model(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    # A stand-in with llama.cpp's command line (model dir, --outfile, --outtype) that checks its input.
    converter = tmp_path / "convert_hf_to_gguf.py"
    converter.write_text(
        textwrap.dedent(
            """
            import argparse, json, pathlib
            parser = argparse.ArgumentParser()
            parser.add_argument("model")
            parser.add_argument("--outfile", type=pathlib.Path)
            parser.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0", "tq1_0", "tq2_0", "auto"])
            args = parser.parse_args()
            model = pathlib.Path(args.model)
            config = json.loads((model / "config.json").read_text())
            assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
            args.outfile.write_text(config["architectures"][0] + " " + args.outtype)
            """
        )
    )
    _, run_dir = fedit_run

    result = export_run(run_dir, "gguf", tmp_path / "gguf", converter=converter, outtype="q8_0")

    assert (tmp_path / "gguf" / GGUF_FILE).read_text() == "LlamaForCausalLM q8_0"
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == ["README.md", INFO_FILE, GGUF_FILE]
    assert "library_name: gguf" in (tmp_path / "gguf" / "README.md").read_text()
    assert "converted to GGUF (q8_0)" in result.what


def test_gguf_without_a_converter_fetches_llama_cpps_and_runs_it_with_its_own_gguf(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a fake llama-cpp-python sdist whose converter writes where its `gguf` package came from.
    top = f"{LLAMA_SDIST_TOP}/vendor/llama.cpp"
    script = b"import sys, gguf; open(sys.argv[sys.argv.index('--outfile') + 1], 'w').write(gguf.SOURCE)"
    sdist = fake_llama_sdist(
        tmp_path / f"{LLAMA_SDIST_TOP}.tar.gz",
        {f"{top}/convert_hf_to_gguf.py": script, f"{top}/gguf-py/gguf/__init__.py": b"SOURCE = 'gguf-py'"},
    )
    download, calls = pin_fake_llama_sdist(sdist, monkeypatch)
    monkeypatch.setattr(llama_cpp, "pip_download_sdist", download)
    monkeypatch.setenv("FEDTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(CONVERTER_ENV, raising=False)
    _, run_dir = fedit_run

    # Execute
    for name in ("first", "second"):
        export_run(run_dir, "gguf", tmp_path / name)

    # Assert: fetched once into the cache, run with the sdist's gguf-py ahead of the installed gguf
    assert calls == [f"llama-cpp-python=={llama_cpp.VERSION}"]
    assert (tmp_path / "second" / GGUF_FILE).read_text() == "gguf-py"
    assert (llama_cpp.converter_dir(tmp_path / "cache") / "convert_hf_to_gguf.py").is_file()


def test_gguf_without_a_converter_or_a_registry_says_how_to_name_one(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(requirement: str, destination: Path) -> None:
        raise ZooError(f"pip could not download the source of {requirement}: no index")

    monkeypatch.setattr(llama_cpp, "pip_download_sdist", unreachable)
    monkeypatch.setenv("FEDTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(CONVERTER_ENV, raising=False)
    _, run_dir = fedit_run

    done = CliRunner().invoke(app, ["export", str(run_dir), "--format", "gguf", "-o", str(tmp_path / "g")])

    assert done.exit_code == 2
    message = " ".join(done.output.split())
    assert f"llama-cpp-python=={llama_cpp.VERSION}" in message
    assert "convert_hf_to_gguf.py" in message and "--converter" in message and CONVERTER_ENV in message
    assert not (tmp_path / "g").exists()


def test_refusals_name_what_can_be_done(fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path) -> None:
    _, run_dir = fedit_run
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")

    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_run(run_dir, "peft", tmp_path / "full")
    with pytest.raises(ExportError, match="choose peft, merged, gguf"):
        export_run(run_dir, "onnx", tmp_path / "x")
    with pytest.raises(FinalModelError, match="no final-model variant"):
        export_run(run_dir, "peft", tmp_path / "x", variant="adapemu")


@pytest.mark.parametrize(
    ("algorithm", "variant", "options"),
    [
        ("fedpt", None, {}),  # the small LM with its adapter
        ("fedbiot", "adapemu", {}),  # the adapter on the emulator, a model with fewer layers
        ("fedmkt", None, {}),  # the server LLM with its LoRA
    ],
)
def test_each_methods_merged_export_is_its_final_model(
    algorithm: str, variant: str | None, options: dict[str, str], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Execute
    cfg = tiny_config(algorithm, "fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]")
    quiet_runner(cfg, tmp_path / "run").run()
    export_run(tmp_path / "run", "merged", tmp_path / "merged", variant=variant, options=options)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    records = prepare_data(cfg).eval_records
    small = variant or ("small" if algorithm == "fedpt" else None)
    final = load_final(tmp_path / "run", small, options)

    # Assert
    assert CausalLMModel(cfg, model, tokenizer).evaluate(records).metrics["perplexity"] == pytest.approx(
        final.evaluate(records).metrics["perplexity"], rel=1e-4
    )


def test_a_perfit_clients_export_scores_what_the_run_reported_for_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Execute
    cfg = tiny_config("perfit", "fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]")
    history = quiet_runner(cfg, tmp_path / "run").run()
    export_run(tmp_path / "run", "merged", tmp_path / "merged", options={"client": "c01"})
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    held_out = prepare_data(cfg).client_eval["c01"]

    # Assert: the client's own model (G at its mask), as its evaluate_personal scored it
    assert CausalLMModel(cfg, model, tokenizer).evaluate(held_out).metrics["perplexity"] == pytest.approx(
        history[-1]["eval_by_client"]["c01"]["perplexity"], rel=1e-4
    )
    with pytest.raises(FinalModelError, match=r"--option client=ID \(clients with a model: c00, c01"):
        export_run(tmp_path / "run", "peft", tmp_path / "peft")


def test_a_fedmkt_clients_slm_exports_and_scores_what_the_run_reported_for_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    # Execute: client c01 holds tiny-qwen2-spm (fedmkt.clients), not the server's LLM
    cfg = tiny_config("fedmkt", "fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]")
    history = quiet_runner(cfg, tmp_path / "run").run()
    export_run(tmp_path / "run", "merged", tmp_path / "merged", options={"client": "c01"})
    export_run(tmp_path / "run", "peft", tmp_path / "peft", options={"client": "c01"})
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    # The run's own tokenizer: the tiny SentencePiece-style tokenizer, saved, reloads as another class
    # (transformers' Qwen2Tokenizer) that splits text differently; a real model's tokenizer round-trips.
    tokenizer = load_final(tmp_path / "run", None, {"client": "c01"}).tokenizer
    held_out = prepare_data(cfg).client_eval["c01"]

    # Assert: the SLM with its own LoRA, as the client's personal evaluation scored it, named as its base
    assert CausalLMModel(cfg, model, tokenizer).evaluate(held_out).metrics["perplexity"] == pytest.approx(
        history[-1]["eval_by_client"]["c01"]["perplexity"], rel=1e-4
    )
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-qwen2-spm"
    with pytest.raises(
        FinalModelError, match=r"not a client with a trained SLM \(clients with one: c00, c01"
    ):
        load_final(tmp_path / "run", None, {"client": "c09"})


def test_fedpft_exports_its_classifier_merged_and_nothing_else(tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from fedtune.algorithms.fedpft.final import classification_result
    from fedtune.data.classify import encode_classification

    # Execute
    cfg = tiny_config("fedpft", "fed.rounds=1", "eval.before=false")
    quiet_runner(cfg, tmp_path / "run").run()
    result = export_run(tmp_path / "run", "merged", tmp_path / "merged")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    records = prepare_data(cfg).eval_records
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    examples = encode_classification(records, tokenizer, names, cfg.data.max_length)
    scores = classification_result(
        model, examples, records, len(names), batch_size=8, pad_token_id=int(tokenizer.pad_token_id or 0)
    )

    # Assert
    assert "sequence-classification" in result.what
    assert scores.metrics == pytest.approx(load_final(tmp_path / "run").evaluate(records).metrics)
    for fmt in ("peft", "gguf"):
        with pytest.raises(ExportError, match="exports merged, not"):
            export_run(tmp_path / "run", fmt, tmp_path / fmt)


def test_a_truncated_adapter_is_named_as_damage_not_a_reader_traceback(
    fedit_run: tuple[ExperimentConfig, Path], tmp_path: Path
) -> None:
    # Prepare: a copy of the finished run whose adapter file was cut short
    import shutil

    _, source = fedit_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    adapter = run_dir / "artifacts" / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[: adapter.stat().st_size // 2])

    # Execute
    result = CliRunner().invoke(
        app, ["export", str(run_dir), "--format", "merged", "-o", str(tmp_path / "out")]
    )

    # Assert: a clear message naming the file, no traceback; loading says the same
    assert result.exit_code != 0
    assert str(adapter) in result.output.replace("\n", "")
    assert "damaged" in result.output and "Traceback" not in result.output
    with pytest.raises(FinalModelError, match="final model is damaged"):
        load_final(run_dir)
