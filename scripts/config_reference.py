"""Write ``docs/config.md``, the config reference, from the pydantic classes that validate a config.

    python scripts/config_reference.py            # rewrite docs/config.md
    python scripts/config_reference.py --check    # exit 1 if docs/config.md is not what this writes

The common sections are the fields of ``fedtune.config.ExperimentConfig``; each method's own section is
the ``Config`` class of the algorithm registered under that name (``fedtune.plugins``), wherever its
module lives. A key's text is, first found: the field's ``description``, the string literal under the
field (an attribute docstring), the comment lines right above it or the comment at the end of its line.
A key without any of these is an error: every key is documented beside its field.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import sys
import textwrap
import tokenize
import types
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedtune.config import ExperimentConfig  # noqa: E402
from fedtune.plugins import algorithm_names, config_class  # noqa: E402

OUTPUT = ROOT / "docs" / "config.md"
WIDTH = 120
COMMAND = "python scripts/config_reference.py"

INTRO = """\
A run is one YAML file, validated before anything runs: an unknown key fails with a "did you mean", a
wrong type names the dotted key. Any key can be overridden on the command line as `section.key=value`
(`fedtune run CONFIG fed.rounds=5 lora.r=16`); `section=null` drops a section (`algorithm=fedit
fedpt=null` runs FedIT from a FedPT config). The running algorithm's own section is validated by that
algorithm's config class; a section of another algorithm is an error.

This page is generated from the config classes by `{command}`; do not edit it by hand.

Sections: {sections}.
"""


# ------------------------------------------------------------------------------------ field documentation
def _comments(source: str) -> tuple[dict[int, str], dict[int, str]]:
    """Comment text by line: comments alone on their line, and comments after code."""
    alone: dict[int, str] = {}
    trailing: dict[int, str] = {}
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row, col = token.start
        text = token.string.lstrip("#").strip()
        (alone if not lines[row - 1][:col].strip() else trailing)[row] = text
    return alone, trailing


def _class_field_docs(cls: type) -> dict[str, str]:
    """Field name -> the text its own class body gives it (attribute docstring or comments)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    if not isinstance(body, ast.ClassDef):
        return {}
    alone, trailing = _comments(source)
    docs: dict[str, str] = {}
    for index, node in enumerate(body.body):
        if not isinstance(node, ast.AnnAssign | ast.Assign):
            continue
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        following = body.body[index + 1] if index + 1 < len(body.body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[target.id] = inspect.cleandoc(following.value.value)
            continue
        above: list[str] = []
        row = node.lineno - 1
        while row in alone:
            above.insert(0, alone[row])
            row -= 1
        text = " ".join(above) or trailing.get(node.end_lineno or node.lineno, "")
        if text:
            docs[target.id] = text
    return docs


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Every field's text, from the class that defines it or, failing that, a base class."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            docs.update(_class_field_docs(cls))
    for name, info in model.model_fields.items():
        if info.description:
            docs[name] = info.description
    return docs


def class_doc(model: type) -> str:
    """The class's own docstring (not an inherited one), with ``code`` as Markdown code."""
    doc = model.__dict__.get("__doc__")
    return markdown(inspect.cleandoc(doc)) if isinstance(doc, str) else ""


def markdown(text: str) -> str:
    return text.replace("``", "`")


# ------------------------------------------------------------------------------------- types and values
def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(str(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if arg is Ellipsis else type_name(arg) for arg in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def bounds(metadata: Iterable[Any]) -> str:
    """A field's numeric bounds (``Field(ge=0, lt=1)``) as ``>= 0, < 1``."""
    parts = []
    for constraint in metadata:
        for attribute, symbol in BOUNDS:
            value = getattr(constraint, attribute, None)
            if value is not None:
                parts.append(f"{symbol} {value_text(value)}")
    return ", ".join(parts)


def value_text(value: Any) -> str:
    """A value as it is written in a YAML config."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def default_text(info: Any) -> str | None:
    """The default as written in YAML; a section default lists the keys that differ from its class."""
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return None
    else:
        value = info.default
    if isinstance(value, BaseModel):
        plain = type(value)()
        changed = {
            (field.alias or name): getattr(value, name)
            for name, field in type(value).model_fields.items()
            if getattr(value, name) != getattr(plain, name)
        }
        return ", ".join(f"`{key}: {value_text(item)}`" for key, item in changed.items()) or None
    return value_text(value)


# --------------------------------------------------------------------------------------------- rendering
class Undocumented(ValueError):
    """A config key whose class gives it no text."""


def item(key: str, info: Any, text: str) -> str:
    """One key as a list item: type, bounds, default, then its text, filled to the page width."""
    default = default_text(info)
    if info.annotation in SHARED_SECTIONS:
        head = f"- `{key}`: a `{SHARED_SECTIONS[info.annotation]}:` section"
        if default is not None:
            head += f"; its defaults differ in {default}"
    else:
        head = f"- `{key}`: `{type_name(info.annotation)}`"
        limits = bounds(info.metadata)
        if limits:
            head += f" ({limits})"
        if default is None and info.is_required():
            head += ", required"
        elif default is not None:
            head += f", default `{default}`"
    sentence = f"{head}. {markdown(text)}" if text else f"{head}."
    return textwrap.fill(
        sentence, width=WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )


def _text(key: str, text: str, undocumented: list[str]) -> str:
    """``text``, noting ``key`` as undocumented when it is empty."""
    if not text:
        undocumented.append(key)
    return text


def render_section(
    prefix: str, model: type[BaseModel], undocumented: list[str], level: int, note: str = ""
) -> list[str]:
    """One section's heading, its class text and an item per key; nested sections follow it.

    A key holding one of the common sections (FedMKT's ``llm_train`` is a ``train:``) is one item that
    names that section; any other nested class is a section of its own (``data.partition``).
    """
    docs = field_docs(model)
    lines = [f"{'#' * level} `{prefix.rstrip('.')}`", ""]
    for paragraph in (class_doc(model), note):
        if paragraph:
            lines += [_reflow(paragraph), ""]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        dotted = f"{prefix}{key}"
        annotation = info.annotation
        if (
            annotation not in SHARED_SECTIONS
            and isinstance(annotation, type)
            and issubclass(annotation, BaseModel)
        ):
            nested.append((dotted, annotation))
            continue
        lines.append(item(key, info, _text(dotted, docs.get(name, ""), undocumented)))
    lines.append("")
    for dotted, annotation in nested:
        lines += render_section(f"{dotted}.", annotation, undocumented, level + 1)
    return lines


def _reflow(text: str) -> str:
    """Paragraphs of a docstring, each filled to the page width (lists and indented blocks kept)."""
    out = []
    for paragraph in text.split("\n\n"):
        if any(line.startswith(("-", " ", "*")) for line in paragraph.splitlines()):
            out.append(paragraph)
        else:
            out.append(textwrap.fill(" ".join(paragraph.split()), width=WIDTH, break_on_hyphens=False))
    return "\n\n".join(out)


def _common_sections() -> dict[Any, str]:
    """Section class -> its key in the config (a method's section may reuse one, e.g. ``train``)."""
    return {
        info.annotation: name
        for name, info in ExperimentConfig.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
    }


SHARED_SECTIONS = _common_sections()


def method_modes(config: type) -> str:
    """The ``fed.mode`` values a method implements and whether it evaluates clients' own models."""
    modes = ", ".join(f"`{mode}`" for mode in getattr(config, "modes", ("federated",)))
    text = f"Runs in `fed.mode`: {modes}."
    if getattr(config, "requires_personal_eval", False):
        text += " Needs `eval.personal: true` (every model is a client's own)."
    elif getattr(config, "personal_eval", False):
        text += " Supports `eval.personal: true`."
    return text


def render(names: Iterable[str] | None = None) -> str:
    """The whole page: the common sections, then the own section of every algorithm in ``names``
    (default: every registered one)."""
    names = list(algorithm_names() if names is None else names)
    undocumented: list[str] = []
    keys = [*SHARED_SECTIONS.values(), *names]
    sections = ["[top level](#top-level)", *(f"[`{key}`](#{key})" for key in keys)]
    intro = _reflow(INTRO.format(command=COMMAND, sections=", ".join(sections))).rstrip()
    lines = ["# Config reference", "", intro, "", "## Top level", ""]
    docs = field_docs(ExperimentConfig)
    for name, info in ExperimentConfig.model_fields.items():
        if info.annotation not in SHARED_SECTIONS:
            key = info.alias or name
            lines.append(item(key, info, _text(key, docs.get(name, ""), undocumented)))
    lines.append("")
    for annotation, key in SHARED_SECTIONS.items():
        lines += render_section(f"{key}.", annotation, undocumented, level=2)
    lines += ["## Method sections", "", "The running algorithm's own section, named after it.", ""]
    for name in names:
        config = config_class(name)
        lines += render_section(f"{name}.", config, undocumented, level=3, note=method_modes(config))
    if undocumented:
        raise Undocumented(
            "config keys without documentation beside their field (a string under it): "
            + ", ".join(undocumented)
        )
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    args = parser.parse_args(argv)
    try:
        text = render()
    except Undocumented as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
