"""``fedtune export``: a finished run's final model as files other tools load.

- ``peft``: the LoRA adapter as a standard peft directory (``PeftModel.from_pretrained(base, DIR)``);
- ``merged``: the adapter merged into the base, a transformers model directory with its tokenizer
  (``AutoModelForCausalLM.from_pretrained(DIR)``, and any tool that reads one);
- ``gguf``: the merged model converted by llama.cpp's ``convert_hf_to_gguf.py``: the copy fetched once
  from the pinned llama-cpp-python source distribution (`fedtune.models.llama_cpp`), or the one that
  ``--converter PATH`` or ``$FEDTUNE_GGUF_CONVERTER`` names (a llama.cpp checkout's).

What the final model is, and so what can be exported, is the run's method's to say
(``Algorithm.export_formats`` and ``Algorithm.export_final``); ``fedtune-export.json`` beside the files
records what was written and from which run, and ``README.md`` is the model card written from the run
(`fedtune.modelcard`). Files are written with the umask's mode (``fedtune.files.honour_umask``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedtune.algorithms.exporting import Exported, ExportError
from fedtune.algorithms.final import FinalRun, check_options, check_variant, intact_artifacts
from fedtune.algorithms.registry import get_algorithm
from fedtune.artifacts import run_config
from fedtune.files import honour_umask
from fedtune.modelcard import write_model_card

FORMATS = ("peft", "merged", "gguf")
CONVERTER_ENV = "FEDTUNE_GGUF_CONVERTER"
"""Where llama.cpp's ``convert_hf_to_gguf.py`` is (the script, or the llama.cpp directory)."""
CONVERTER_NAME = "convert_hf_to_gguf.py"
GGUF_FILE = "model.gguf"
INFO_FILE = "fedtune-export.json"
Exporter = Callable[[FinalRun, str, Path], Exported]
"""``Algorithm.export_final``: writes the final model in a format, says what it wrote."""
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "auto")
"""``--outtype`` values of llama.cpp's converter that fedtune passes on."""


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, in which format, and what it holds (in a sentence)."""

    output: Path
    format: str
    what: str


def find_converter(converter: str | Path | None = None) -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py``: ``converter`` (the script or its directory), else
    ``$FEDTUNE_GGUF_CONVERTER``, else the copy fetched once from the pinned llama-cpp-python sdist."""
    given = converter or os.environ.get(CONVERTER_ENV)
    if not given:
        return _fetched_converter()
    path = Path(given).expanduser()
    if path.is_dir():
        path = path / CONVERTER_NAME
    if not path.is_file():
        source = "--converter" if converter else CONVERTER_ENV
        raise ExportError(f"{source}: {path} is not a file (expected llama.cpp's {CONVERTER_NAME})")
    return path


def _fetched_converter() -> Path:
    from fedtune.models.llama_cpp import fetch_converter
    from fedtune.models.zoo import ZooError

    try:
        return fetch_converter()
    except ZooError as exc:
        raise ExportError(
            f"{exc}\nOr name a llama.cpp checkout's {CONVERTER_NAME} with --converter or {CONVERTER_ENV}, "
            "or export --format merged and convert that directory yourself"
        ) from exc


def export_run(
    run_dir: Path,
    fmt: str,
    output: Path,
    *,
    variant: str | None = None,
    options: Mapping[str, str] | None = None,
    converter: str | Path | None = None,
    outtype: str = "f16",
) -> ExportResult:
    """Write the final model of the finished run in ``run_dir`` to ``output`` (a new or empty directory)
    as ``fmt``; ``variant`` and ``options`` pick the final model as for ``fedtune eval``, ``converter``
    and ``outtype`` are for ``gguf``."""
    cfg = run_config(run_dir)
    method = get_algorithm(cfg.algorithm)
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: choose {', '.join(FORMATS)}")
    if fmt not in method.export_formats:
        raise ExportError(
            f"a {cfg.algorithm!r} run exports {', '.join(method.export_formats) or 'nothing'}, not {fmt!r}"
        )
    if fmt == "gguf" and outtype not in GGUF_TYPES:
        raise ExportError(f"--outtype {outtype!r}: choose {', '.join(GGUF_TYPES)}")
    options = dict(options or {})
    check_options(method.name, method.final_options, options)
    run = FinalRun(cfg, run_dir, check_variant(method.name, method.final_variants, variant), options)
    script = find_converter(converter) if fmt == "gguf" else None
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"{output} exists and is not an empty directory: choose another --output")
    output.mkdir(parents=True, exist_ok=True)
    with intact_artifacts(run_dir):
        if script is None:
            exported = method.export_final(run, fmt, output)
        else:
            exported = _gguf(method.export_final, run, script, output, outtype)
    info = {
        "run_dir": str(run_dir.resolve()),
        "algorithm": cfg.algorithm,
        "format": fmt,
        "variant": run.variant,
        "options": options,
        "base_model": cfg.model.name,
        "template": cfg.data.template,
        "what": exported.what,
    }
    (output / INFO_FILE).write_text(json.dumps(info, indent=1))
    write_model_card(output, run_dir, cfg, fmt)
    honour_umask(output)
    return ExportResult(output, fmt, exported.what)


def _gguf(export_final: Exporter, run: FinalRun, script: Path, output: Path, outtype: str) -> Exported:
    """The merged export converted by llama.cpp's converter to ``output/model.gguf``."""
    with tempfile.TemporaryDirectory(dir=output, prefix=".merged-") as merged:
        exported = export_final(run, "merged", Path(merged))
        if not exported.causal_lm:
            raise ExportError(f"GGUF holds causal language models; this export is not one ({exported.what})")
        done = subprocess.run(
            [sys.executable, str(script), merged, "--outfile", str(output / GGUF_FILE), "--outtype", outtype],
            capture_output=True,
            text=True,
            env=_converter_env(script),
        )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        missing = "No module named" in tail
        hint = "\n(the converter's requirements: pip install 'fedtune[gguf]')" if missing else ""
        raise ExportError(f"{script} failed (exit {done.returncode}):\n{tail}{hint}")
    return Exported(f"{exported.what}, converted to GGUF ({outtype}) by {script.name}")


def _converter_env(script: Path) -> dict[str, str]:
    """The environment with the ``gguf`` package of the converter's own llama.cpp tree (``gguf-py``) first
    on the path, ahead of an installed ``gguf`` that may be older than the converter expects."""
    env = dict(os.environ)
    gguf_py = script.parent / "gguf-py"
    if gguf_py.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(gguf_py), env.get("PYTHONPATH")]))
    return env
