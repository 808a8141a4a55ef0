"""Models by spec: each distinct spec is loaded once per process; a private copy when asked for."""

from __future__ import annotations

from fedtune.config import validate_config
from fedtune.models.spec import ModelSpec
from fedtune.resources import Resources, model_spec


def test_equal_specs_share_one_model_and_other_specs_get_their_own() -> None:
    resources = Resources(validate_config({"model": {"name": "tiny-llama"}}))
    llama = ModelSpec("tiny-llama")
    qwen = ModelSpec("tiny-qwen2-L2-H32")
    first, _ = resources.model(llama)
    again, _ = resources.model(ModelSpec("tiny-llama"))
    other, _ = resources.model(qwen)
    copy, _ = resources.model(llama, copy="teacher")
    assert first is again and other is not first and copy is not first
    assert resources.loads == [llama.key, qwen.key, llama.key + " (teacher)"]
    assert resources.tokenizer(qwen) is resources.model(qwen)[1]  # no second load for the tokenizer
    assert len(resources.loads) == 3


def test_the_run_model_section_is_the_base_spec() -> None:
    cfg = validate_config({"seed": 7, "model": {"name": "tiny-llama", "dtype": "fp32", "cache_dir": "~/m"}})
    spec = model_spec(cfg.model, cfg.seed)
    assert spec == ModelSpec("tiny-llama", "fp32", "auto", "~/m", None, 7)
    assert spec.cache_path is not None and "~" not in str(spec.cache_path)
    assert Resources(cfg).base_spec == spec and spec.replace(name="x").name == "x"
    assert spec.key != spec.replace(seed=8).key


def test_a_tokenizer_alone_loads_no_model() -> None:
    resources = Resources(validate_config({"model": {"name": "tiny-llama"}}))
    assert resources.tokenizer(ModelSpec("tiny-llama")).pad_token is not None
    assert resources.loads == []
