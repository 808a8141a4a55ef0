"""Generate the built-in ``stdlib-code`` dataset from the Python standard library's own source.

    python scripts/make_code_dataset.py [--out DIR] [--stdlib DIR]

Every public module-level function, and every public method of a public module-level class,
that has a docstring becomes one example: the instruction gives its signature and docstring
(``fedtune.data.code.code_instruction``, the format HumanEval records use too; a method's names
its class), the output is the function's source without the docstring (a method's dedented),
and the category is the module group (9 groups, like the paper's 9 programming languages), so
``partition.scheme: natural`` splits clients by module group. Methods are in because functions
alone give only ~1,000 examples. Filters: a docstring of at least four words in its first
paragraph, a body of 2-40 non-blank lines, an output of at most 1,200 characters; no decorated
functions (the decorator changes what the function is), no private names, no test packages or
private modules; duplicates (same output or same instruction) keep the first in path order.

The files are parsed with ``ast``, never imported. The output is byte-for-byte reproducible for
one Python version (recorded in meta.json): files in sorted order, splits from a seeded hash of
``module:function`` (stable when other functions come and go), gzip with mtime=0.
"""

from __future__ import annotations

import argparse
import ast
import platform
import random
import re
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path

from datagen import common
from datagen.common import DEFAULT_OUT, SEED, SPLITS, write_dataset
from fedtune.data.code import code_instruction, docstring_lines, without_lines

NAME = "stdlib-code"
FRACTIONS = (0.8, 0.05, 0.05, 0.1)
MIN_BODY_LINES, MAX_BODY_LINES = 2, 40
MAX_OUTPUT_CHARS = 1200
MAX_DOCSTRING_CHARS = 1500
WORD = re.compile(r"\b[A-Za-z]{2,}\b")
# Not library code: tests, demos, bundled data, build configuration.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "lib-dynload", "turtledemo", "pydoc_data"}
SKIPPED_DIR_PREFIXES = ("config-",)

# Top-level module -> group; anything unlisted is "misc" (mostly GUI: tkinter, turtle, idlelib).
# fmt: off
GROUPS: dict[str, tuple[str, ...]] = {
    "text": (
        "string", "textwrap", "difflib", "re", "sre_compile", "sre_parse", "sre_constants", "shlex",
        "fnmatch", "gettext", "locale", "codecs", "encodings", "stringprep", "unicodedata", "tokenize",
        "token", "keyword", "pprint", "reprlib", "html", "rlcompleter",
    ),
    "filesystem": (
        "os", "posixpath", "ntpath", "genericpath", "pathlib", "shutil", "glob", "tempfile", "filecmp",
        "fileinput", "stat", "zipfile", "tarfile", "gzip", "bz2", "lzma", "zipimport", "compileall",
        "py_compile", "nturl2path", "linecache", "io",
    ),
    "data_formats": (
        "json", "csv", "configparser", "plistlib", "xml", "tomllib", "pickle", "pickletools", "copyreg",
        "base64", "binascii", "quopri", "uu", "xdrlib", "struct", "mimetypes", "wave", "aifc", "sunau",
        "chunk", "sndhdr", "imghdr", "dbm", "shelve", "sqlite3", "marshal", "netrc", "mailcap",
    ),
    "numbers": (
        "math", "cmath", "fractions", "decimal", "numbers", "random", "statistics", "colorsys",
        "datetime", "calendar", "time", "zoneinfo", "hashlib", "hmac", "secrets", "uuid", "ipaddress",
    ),
    "functional": (
        "collections", "functools", "itertools", "operator", "heapq", "bisect", "copy", "enum",
        "dataclasses", "abc", "types", "typing", "contextlib", "weakref", "graphlib", "array",
    ),
    "network": (
        "email", "http", "urllib", "smtplib", "poplib", "imaplib", "ftplib", "nntplib", "telnetlib",
        "socket", "socketserver", "ssl", "xmlrpc", "wsgiref", "webbrowser", "cgi", "cgitb", "smtpd",
        "asynchat", "asyncore", "mailbox",
    ),
    "concurrency": (
        "asyncio", "concurrent", "multiprocessing", "threading", "queue", "sched", "subprocess",
        "signal", "selectors", "contextvars",
    ),
    "dev_tools": (
        "unittest", "doctest", "pdb", "bdb", "trace", "traceback", "tracemalloc", "profile", "cProfile",
        "pstats", "timeit", "dis", "inspect", "ast", "symtable", "tabnanny", "pyclbr", "pydoc", "code",
        "codeop", "warnings", "logging", "importlib", "pkgutil", "modulefinder", "runpy", "zipapp",
        "venv", "ensurepip", "lib2to3", "distutils", "opcode",
    ),
}
# fmt: on
GROUP_OF = {module: group for group, modules in GROUPS.items() for module in modules}

NOTICE = """\
stdlib-code: derived from the source code of the Python {version} standard library by
scripts/make_code_dataset.py (fedtune). Each example reuses one function's signature,
docstring and code; the instruction phrasing is ours.

The Python standard library is Copyright (c) 2001-2023 Python Software Foundation;
All Rights Reserved. It is distributed under the PSF License Agreement (the "PSF-2.0"
licence, https://docs.python.org/3/license.html), whose terms are in the LICENSE.txt of
every Python distribution. In accordance with that agreement: this dataset is a derivative
work of Python; it is provided "AS IS", and the PSF makes no representations or warranties,
express or implied, and shall not be liable for any damages arising from its use. A brief
summary of the changes: docstrings are moved from each function into its instruction, and
functions are filtered (see the generator's docstring); the code is otherwise unchanged.
"""

Row = dict[str, str]


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(stdlib: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every public library module, sorted by path."""
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib)
        directories = relative.parts[:-1]
        if any(part in SKIPPED_DIRS or part.startswith(SKIPPED_DIR_PREFIXES) for part in directories):
            continue
        name = module_name(relative)
        if not name or any(part.startswith("_") for part in name.split(".")):
            continue
        yield name, path


def has_sentence(docstring: str) -> bool:
    """At least four words in the first paragraph: "Internal function." says nothing."""
    return len(WORD.findall(docstring.split("\n\n")[0])) >= 4


def dedented(source: str, indent: int) -> str | None:
    """``source`` with ``indent`` leading spaces removed, None if a line (in a string) has fewer."""
    lines = source.splitlines()
    if any(line.strip() and not line.startswith(" " * indent) for line in lines):
        return None
    return "\n".join(line[indent:] for line in lines) + "\n"


def example(module: str, function: ast.FunctionDef, source: str, class_name: str | None = None) -> Row | None:
    """The row for ``function`` (a method when ``class_name`` is given), None when a filter drops it."""
    docstring = ast.get_docstring(function)
    if function.name.startswith("_") or function.decorator_list or docstring is None:
        return None
    if not has_sentence(docstring) or len(docstring) > MAX_DOCSTRING_CHARS or len(function.body) < 2:
        return None
    first_doc, rest = function.body[0], function.body[1]
    doc_end = first_doc.end_lineno or first_doc.lineno
    # The docstring must have lines of its own, so dropping them leaves valid code.
    if first_doc.lineno == function.lineno or rest.lineno == doc_end:
        return None
    end = function.end_lineno or function.lineno
    body = [line for line in source.splitlines()[doc_end:end] if line.strip()]
    if not MIN_BODY_LINES <= len(body) <= MAX_BODY_LINES:
        return None
    output = dedented(
        without_lines(source, function.lineno, end, docstring_lines(function)), function.col_offset
    )
    stub = dedented(without_lines(source, function.lineno, doc_end, set()), function.col_offset)
    if output is None or stub is None or len(output) > MAX_OUTPUT_CHARS:
        return None
    qualified = function.name if class_name is None else f"{class_name}.{function.name}"
    return {
        "id": f"{module}:{qualified}",
        "instruction": code_instruction(function.name, stub, class_name),
        "input": "",
        "output": output,
        "category": GROUP_OF.get(module.split(".")[0], "misc"),
    }


def module_rows(module: str, path: Path) -> list[Row]:
    """Examples from the module's functions, then from the methods of its public classes."""
    with tokenize.open(path) as handle:  # honours the file's coding declaration
        source = handle.read()
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError:
        return []  # e.g. lib2to3 test data written in Python 2
    functions = [(node, None) for node in tree.body if isinstance(node, ast.FunctionDef)]
    methods = [
        (node, owner.name)
        for owner in tree.body
        if isinstance(owner, ast.ClassDef) and not owner.name.startswith("_")
        for node in owner.body
        if isinstance(node, ast.FunctionDef)
    ]
    return [row for node, owner in functions + methods if (row := example(module, node, source, owner))]


def collect(stdlib: Path) -> list[Row]:
    """Every example in file order, the first of any duplicate output or instruction kept."""
    rows: list[Row] = []
    seen: set[str] = set()
    for module, path in source_files(stdlib):
        for row in module_rows(module, path):
            keys = {"".join(row["output"].split()), row["instruction"]}
            if keys & seen:
                continue
            seen |= keys
            rows.append(row)
    return rows


def split_of(anchor: str) -> str:
    return common.split_of(f"{SEED}:{NAME}", anchor, FRACTIONS)


def build(stdlib: Path) -> dict[str, list[Row]]:
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    for row in collect(stdlib):
        splits[split_of(row["id"])].append(row)
    rng = random.Random(f"{SEED}:{NAME}:order")
    for split, rows in splits.items():
        rng.shuffle(rows)
        for index, row in enumerate(rows):
            # The module:function anchor stays readable after the split-unique number.
            row["id"] = f"code-{split}-{index:05d}-{row['id']}"
    return splits


def write(out_dir: Path, splits: dict[str, list[Row]], python_version: str) -> None:
    meta = {
        "name": NAME,
        "task": "code",
        "licence": "PSF-2.0",
        "description": "Python functions from their signature and docstring (output: the function "
        "without its docstring); category = standard-library module group, for non-IID splits.",
        "source": f"the Python {python_version} standard library source, parsed with ast",
        "python_version": python_version,
        "metrics": ["rougeL", "pass_at_1 on humaneval"],
        "filters": {
            "functions": "public module-level functions and methods of public module-level classes; "
            "no decorated ones",
            "docstring": f"first paragraph of at least 4 words, at most {MAX_DOCSTRING_CHARS} characters",
            "body_lines": [MIN_BODY_LINES, MAX_BODY_LINES],  # non-blank, after the docstring
            "max_output_chars": MAX_OUTPUT_CHARS,
            "dedupe": "by output (whitespace ignored) and by instruction; first in path order kept",
        },
        "groups": {**{group: list(modules) for group, modules in GROUPS.items()}, "misc": ["(the rest)"]},
    }
    notice = NOTICE.format(version=python_version)
    write_dataset(out_dir, meta, splits, notice, generator="scripts/make_code_dataset.py")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    args = parser.parse_args(argv)
    if not (args.stdlib / "textwrap.py").is_file():
        raise SystemExit(f"{args.stdlib}: no standard-library source here (pass --stdlib DIR)")
    write(args.out, build(args.stdlib), platform.python_version())


if __name__ == "__main__":
    main()
