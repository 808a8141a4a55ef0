"""What a run's final model says about itself when it leaves the run: the base model it adapts, named so
that another machine can find it, and a model card (``README.md``) written from the run.

The base model is named by its Hugging Face Hub id where one is known (a zoo model's ``hub_id``, or a
model name that is a hub id); otherwise by the path this machine loaded it from, and a tiny random model
by its fedtune name. The card says both, with how fedtune's copy differs from the hub's (a zoo model
converted from a quantised GGUF file is close to the hub's weights, not equal to them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedtune.config import ExperimentConfig, ModelConfig
from fedtune.files import honour_umask

CARD_FILE = "README.md"
CARD_FORMATS = ("peft", "merged", "gguf")


@dataclass(frozen=True)
class BaseModel:
    """A run's base model: ``name`` as the config gives it, the Hub id it comes from (None where there
    is none), the local path it was loaded from (None for a hub id or a tiny model) and a note on how
    the weights fedtune trained on relate to the hub's."""

    name: str
    hub_id: str | None
    local_path: str | None
    note: str = ""

    @property
    def reference(self) -> str:
        """What ``base_model_name_or_path`` says: the hub id, else the local path, else the name."""
        return self.hub_id or self.local_path or self.name


def base_model_of(model: ModelConfig) -> BaseModel:
    """Where the ``model:`` section's base model comes from (as `fedtune.models.loading` resolves it)."""
    from fedtune.models.loading import derived_path, looks_like_path, parse_tiny_name
    from fedtune.models.zoo import get_entry, zoo_names, zoo_path

    name = model.name
    cache_dir = Path(model.cache_dir).expanduser() if model.cache_dir else None
    if parse_tiny_name(name) is not None:
        return BaseModel(name, None, None, "a seeded random tiny model fedtune builds from its name")
    if name in zoo_names():
        entry = get_entry(name)
        local = zoo_path(entry, cache_dir)
        note = f"fedtune's zoo copy ({entry.assembly}): close to the hub's weights, not equal to them"
        return BaseModel(name, entry.hub_id, str(local) if local else None, note)
    derived = derived_path(name, cache_dir)
    if derived is not None:
        return BaseModel(name, None, str(derived), "a smaller model made by `fedtune models derive`")
    path = Path(name).expanduser()
    if path.exists() or looks_like_path(name):
        local = path.resolve() / model.gguf_file if model.gguf_file else path.resolve()
        return BaseModel(name, None, str(local))
    return BaseModel(name, name, None)


def name_base_model(peft_model: Any, base: BaseModel) -> None:
    """Set every adapter config's ``base_model_name_or_path`` of ``peft_model`` to ``base``'s reference
    (peft writes the loaded model's own path there: none for a model built in memory, a cache path for
    a local one)."""
    for adapter_config in peft_model.peft_config.values():
        adapter_config.base_model_name_or_path = base.reference


def save_peft_adapter(peft_model: Any, directory: Path, base: BaseModel) -> None:
    """``peft_model``'s adapter as a standard peft directory naming ``base`` as its base model.

    ``save_embedding_layers=False``: fedtune never resizes the vocabulary, and peft's "auto" would look
    the named base up on the Hub to compare vocabularies (a request online, a warning offline).
    """
    name_base_model(peft_model, base)
    peft_model.save_pretrained(str(directory), save_embedding_layers=False)


def write_model_card(directory: Path, run_dir: Path, cfg: ExperimentConfig, fmt: str) -> Path:
    """``directory/README.md``: the card of the run's final model exported as ``fmt`` (peft, merged or
    gguf), replacing peft's blank template."""
    if fmt not in CARD_FORMATS:
        raise ValueError(f"no model card for format {fmt!r} (valid: {', '.join(CARD_FORMATS)})")
    path = directory / CARD_FILE
    path.write_text(model_card(run_dir, cfg, fmt), encoding="utf-8")
    return path


def model_card(run_dir: Path, cfg: ExperimentConfig, fmt: str) -> str:
    """The card's markdown: front matter as the Hub reads it, then what the model is, how to load it,
    the data, the final metrics and the config that made it."""
    base = base_model_of(cfg.model)
    sections = [
        _front_matter(base, cfg, fmt),
        f"# {cfg.name}: {_what(fmt)}\n",
        _summary(cfg, last_round(run_dir)),
        _base_section(base),
        _use_section(base, cfg, fmt),
        _data_section(cfg),
        _metrics_section(run_dir),
        _config_section(run_dir, cfg),
    ]
    return "\n".join(section for section in sections if section)


def last_round(run_dir: Path) -> int:
    """The last round ``metrics.jsonl`` has a row of (0 when there is none)."""
    return max((row.get("round", 0) for row in _rows(run_dir)), default=0)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by an interruption
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _what(fmt: str) -> str:
    return {
        "peft": "a LoRA adapter (peft)",
        "merged": "a transformers model (adapter merged)",
        "gguf": "a GGUF model",
    }[fmt]


def _front_matter(base: BaseModel, cfg: ExperimentConfig, fmt: str) -> str:
    matter: dict[str, Any] = {}
    if base.hub_id:
        matter["base_model"] = base.hub_id
    matter["library_name"] = {"peft": "peft", "merged": "transformers", "gguf": "gguf"}[fmt]
    matter["tags"] = ["fedtune", "federated-learning", cfg.algorithm]
    return "---\n" + yaml.safe_dump(matter, sort_keys=False) + "---\n"


def _summary(cfg: ExperimentConfig, rounds: int) -> str:
    clients = (
        "one party (centralized)"
        if cfg.fed.mode == "centralized"
        else f"{cfg.data.partition.num_clients} clients ({cfg.fed.mode})"
    )
    return (
        f"Fine-tuned by fedtune with the method **{cfg.algorithm}**: "
        f"{rounds} of {cfg.fed.rounds} rounds, {clients}, seed {cfg.seed}.\n"
    )


def _base_section(base: BaseModel) -> str:
    lines = ["## Base model\n"]
    if base.hub_id:
        lines.append(f"- Hugging Face Hub: `{base.hub_id}` (the adapter's `base_model_name_or_path`)")
    if base.local_path:
        lines.append(f"- loaded from: `{base.local_path}` (on the machine that trained it)")
    if not base.hub_id and not base.local_path:
        lines.append(f"- `{base.name}`")
    if base.note:
        lines.append(f"- {base.note}")
    return "\n".join(lines) + "\n"


def _use_section(base: BaseModel, cfg: ExperimentConfig, fmt: str) -> str:
    template = f"Prompts as in training: the run's `{cfg.data.template}` template (`data.template`).\n"
    if fmt == "gguf":
        return "## Use\n\n`model.gguf` loads in llama.cpp and the tools built on it. " + template
    if fmt == "merged":
        code = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/directory")\n'
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")\n'
        )
    elif base.hub_id or base.local_path:
        code = (
            "from peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'base = AutoModelForCausalLM.from_pretrained("{base.reference}")\n'
            'model = PeftModel.from_pretrained(base, "path/to/this/directory")\n'
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")\n'
        )
    else:  # a tiny random model exists only as fedtune builds it, from its name and the run's seed
        code = (
            "from peft import PeftModel\n\n"
            "from fedtune.models.loading import load_causal_lm\n\n"
            f'base, tokenizer = load_causal_lm("{base.name}", seed={cfg.seed})\n'
            'model = PeftModel.from_pretrained(base, "path/to/this/directory")\n'
        )
    return f"## Use\n\n```python\n{code}```\n\n{template}"


def _data_section(cfg: ExperimentConfig) -> str:
    data = cfg.data
    lines = ["## Data\n", f"- training data: `{data.dataset}`"]
    if data.max_train_examples:
        lines.append(f"- at most {data.max_train_examples} training examples (`data.max_train_examples`)")
    if cfg.fed.mode != "centralized":
        lines.append(f"- partition: `{data.partition.scheme}` over {data.partition.num_clients} clients")
    test = (
        f"`{data.eval_dataset}`"
        if data.eval_dataset
        else "the training data's test split (of a file: 10% held out)"
    )
    lines.append(f"- evaluated on: {test} (at most {cfg.eval.max_examples or 'all'} examples)")
    return "\n".join(lines) + "\n"


def _metrics_section(run_dir: Path) -> str:
    scored = [row for row in _rows(run_dir) if row.get("eval")]
    if not scored:
        return ""
    first, last = scored[0], scored[-1]
    lines = [
        f"## Final metrics (round {last.get('round', 0)})\n",
        f"| metric | round {first.get('round', 0)} | round {last.get('round', 0)} |",
        "|---|---:|---:|",
    ]
    for metric, value in last["eval"].items():
        lines.append(f"| {metric} | {_number(first['eval'].get(metric))} | {_number(value)} |")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def _config_section(run_dir: Path, cfg: ExperimentConfig) -> str:
    saved = run_dir / "config.yaml"
    text = saved.read_text(encoding="utf-8") if saved.is_file() else yaml.safe_dump(cfg.to_yaml_dict())
    return (
        "## How it was made\n\n"
        "`fedtune run config.yaml` with this config (the run's resolved `config.yaml`):\n\n"
        f"```yaml\n{text.rstrip()}\n```\n"
    )


def finish_artifacts(run_dir: Path, cfg: ExperimentConfig) -> None:
    """A finished run's ``artifacts/``: each peft adapter directory gets the run's card in place of
    peft's blank template, and every file the mode a plain write gives it (`fedtune.files`)."""
    artifacts = run_dir / "artifacts"
    for adapter_config in sorted(artifacts.rglob("adapter_config.json")):
        write_model_card(adapter_config.parent, run_dir, cfg, "peft")
    honour_umask(artifacts)
