"""Generate the built-in offline datasets shipped in ``src/fedtune/data/builtin/``.

    python scripts/make_datasets.py [--out DIR] [--only NAME ...] [--wordnet-dir DIR]

Seven datasets, each with train / validation / test / public splits (``public`` is disjoint
from the others and is meant for methods that distil on public data):

- ``wordnet-instruct``: instruction following over WordNet 3.0 (10 task categories).
- ``arith-word-problems``: GSM8K-style word problems with worked solutions ending in ``#### N``.
- ``wordnet-lexclass``: gloss -> lexicographer class, for encoder classifiers.
- Multiple choice, scored by the log-likelihood of each choice (``acc``, ``acc_norm``); every row
  has ``choices``, ``label`` (the right choice's index) and ``output`` = the right choice:
  ``wordnet-wic`` (same sense in two sentences? no / yes), ``wordnet-defchoice`` (which of 4
  definitions fits a word), ``wordnet-hypernym-yn`` ("Is 'X' a kind of Y?" no / yes) and
  ``arith-choice`` (the arith-word-problems questions with 4 numeric answers).

Each set's generator is a module of ``scripts/datagen/``. The output is byte-for-byte
reproducible: seeded ``random.Random`` instances, sorted iteration (never over sets, whose order
depends on PYTHONHASHSEED) and gzip with mtime=0. WordNet is read straight from its database
files (``wordnet-base`` on Debian).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

from datagen import (
    arith,
    wordnet_defchoice,
    wordnet_hypernym_yn,
    wordnet_instruct,
    wordnet_lexclass,
    wordnet_wic,
)
from datagen.common import DEFAULT_OUT, Row, write_dataset
from datagen.wordnet import WORDNET_NOTICE, WordNet, load_wordnet

DATASETS = (
    "wordnet-instruct",
    "arith-word-problems",
    "wordnet-lexclass",
    "wordnet-wic",
    "wordnet-defchoice",
    "wordnet-hypernym-yn",
    "arith-choice",
)
Splits = dict[str, list[Row]]
ProblemSplits = dict[str, list[tuple[str, arith.Problem]]]
# Both arith sets ask the same problems, generated once.
ARITH_SETS: dict[str, tuple[Mapping[str, object], Callable[[ProblemSplits], Splits], str]] = {
    "arith-word-problems": (arith.WORD_PROBLEMS_META, arith.build_arith, arith.ARITH_NOTICE),
    "arith-choice": (arith.CHOICE_META, arith.build_arith_choice, arith.CHOICE_NOTICE),
}
WORDNET_SETS: dict[str, tuple[Mapping[str, object], Callable[[WordNet], Splits]]] = {
    "wordnet-instruct": (wordnet_instruct.META, wordnet_instruct.build_wordnet_instruct),
    "wordnet-lexclass": (wordnet_lexclass.META, wordnet_lexclass.build_wordnet_lexclass),
    "wordnet-wic": (wordnet_wic.META, wordnet_wic.build_wordnet_wic),
    "wordnet-defchoice": (wordnet_defchoice.META, wordnet_defchoice.build_wordnet_defchoice),
    "wordnet-hypernym-yn": (wordnet_hypernym_yn.META, wordnet_hypernym_yn.build_wordnet_hypernym_yn),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"))
    args = parser.parse_args(argv)
    if any(name in ARITH_SETS for name in args.only):
        problems = arith.arith_problems()
        for name, (meta, build, notice) in ARITH_SETS.items():
            if name in args.only:
                write_dataset(args.out, meta, build(problems), notice)
    if any(name in WORDNET_SETS for name in args.only):
        wn = load_wordnet(args.wordnet_dir)
        for name, (meta, build_from) in WORDNET_SETS.items():
            if name in args.only:
                write_dataset(args.out, meta, build_from(wn), WORDNET_NOTICE)


if __name__ == "__main__":
    main()
