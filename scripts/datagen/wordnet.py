"""WordNet 3.0 read straight from its database files (``wordnet-base`` on Debian), and the helpers
the WordNet sets share."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

WORDNET_FILES = tuple(f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv"))
WORDNET_SOURCE = "WordNet 3.0 (Princeton University), read from the wordnet-base database files"

WORDNET_NOTICE = """\
Derived from WordNet 3.0 by scripts/make_datasets.py (fedtune). The examples reuse
WordNet synsets, glosses, example sentences and relations; the instruction phrasings
are ours. WordNet is distributed under the following licence.

WordNet Release 3.0

This software and database is being provided to you, the LICENSEE, by
Princeton University under the following license.  By obtaining, using
and/or copying this software and database, you agree that you have
read, understood, and will comply with these terms and conditions.:

Permission to use, copy, modify and distribute this software and
database and its documentation for any purpose and without fee or
royalty is hereby granted, provided that you agree to comply with
the following copyright notice and statements, including the disclaimer,
and that the same appear on ALL copies of the software, database and
documentation, including modifications that you make for internal
use or for distribution.

WordNet 3.0 Copyright 2006 by Princeton University.  All rights reserved.

THIS SOFTWARE AND DATABASE IS PROVIDED "AS IS" AND PRINCETON
UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES, EXPRESS OR
IMPLIED.  BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON
UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANT-
ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT THE USE
OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT
INFRINGE ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR
OTHER RIGHTS.

The name of Princeton University or Princeton may not be used in
advertising or publicity pertaining to distribution of the software
and/or database.  Title to copyright in this software, database and
any associated documentation shall at all times remain with
Princeton University and LICENSEE agrees to preserve same.
"""


POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "r": "adverb"}
# Lexicographer file names, indexed by the lex_filenum field of data.* lines (WordNet's lexnames file).
# fmt: off
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
    "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
    "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
    "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
    "verb.communication", "verb.competition", "verb.consumption", "verb.contact", "verb.creation",
    "verb.emotion", "verb.motion", "verb.perception", "verb.possession", "verb.social", "verb.stative",
    "verb.weather", "adj.ppl",
)
# fmt: on
CLEAN_LEMMA = re.compile(r"^[A-Za-z][A-Za-z' .-]*$")
ADJECTIVE_MARKER = re.compile(r"\((a|p|ip)\)$")  # syntactic position marks such as "elect(ip)"
QUOTED = re.compile(r'"([^"]+)"')


@dataclass(slots=True)  # not frozen: frozen dataclasses are slow to build, and we build ~500k
class Pointer:
    symbol: str
    target: str
    source_word: int
    target_word: int


@dataclass(slots=True)
class Synset:
    key: str
    pos: str
    lexname: str
    lemmas: tuple[str, ...]
    pointers: tuple[Pointer, ...]
    definition: str
    examples: tuple[str, ...]

    def related(self, *symbols: str) -> list[str]:
        return [p.target for p in self.pointers if p.symbol in symbols and p.source_word == 0]


@dataclass(frozen=True)
class WordNet:
    synsets: dict[str, Synset]
    senses: dict[tuple[str, str], tuple[str, ...]]  # (lemma, pos) -> synset keys, most frequent first
    tagged: dict[tuple[str, str], int]  # (lemma, pos) -> senses seen in the SemCor corpus
    inflections: dict[str, tuple[str, ...]]  # base form -> irregular forms
    familiar: frozenset[str]  # synsets some lemma uses in a sense attested in SemCor

    def is_familiar(self, synset: Synset) -> bool:
        """Filters out obscure entries (rare senses, taxonomy-only species names)."""
        return synset.key in self.familiar

    def primary(self, lemma: str, pos: str) -> str | None:
        keys = self.senses.get((lemma.lower(), pos))
        return keys[0] if keys else None

    def primary_lemma(self, synset: Synset) -> str | None:
        """A clean lemma whose most frequent sense is this synset, so a question about it is unambiguous."""
        for lemma in synset.lemmas:
            if CLEAN_LEMMA.match(lemma) and self.primary(lemma, synset.pos) == synset.key:
                return lemma
        return None


def load_wordnet(directory: Path) -> WordNet:
    missing = [name for name in WORDNET_FILES if not (directory / name).exists()]
    if missing:
        sys.exit(
            f"WordNet 3.0 files missing in {directory}: {', '.join(missing)}.\n"
            "Install them with: apt-get install wordnet-base (or pass --wordnet-dir)."
        )
    synsets: dict[str, Synset] = {}
    for pos_file in ("n", "v", "a", "r"):
        for line in _database_lines(directory / f"data.{POS_FILES[pos_file]}"):
            synset = _parse_synset(line, pos_file)
            synsets[synset.key] = synset
    senses: dict[tuple[str, str], tuple[str, ...]] = {}
    tagged: dict[tuple[str, str], int] = {}
    for pos in ("n", "v", "a", "r"):
        for line in _database_lines(directory / f"index.{POS_FILES[pos]}"):
            tokens = line.split()
            synset_count = int(tokens[2])
            key = (tokens[0].replace("_", " "), pos)
            senses[key] = tuple(pos + offset for offset in tokens[-synset_count:])
            tagged[key] = int(tokens[-synset_count - 1])
    # The index lists senses most frequent first, so the first `tagged` of them are the attested ones.
    familiar = frozenset(key for lemma_pos, keys in senses.items() for key in keys[: tagged[lemma_pos]])
    return WordNet(synsets, senses, tagged, _load_inflections(directory), familiar)


def _database_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith("  "):  # licence header lines start with two spaces
                yield line.rstrip("\n")


def _parse_synset(line: str, pos_file: str) -> Synset:
    data, _, gloss = line.partition(" | ")
    tokens = data.split()
    word_count = int(tokens[3], 16)
    words = tokens[4 : 4 + 2 * word_count : 2]
    if pos_file == "a":
        words = [ADJECTIVE_MARKER.sub("", word) for word in words]
    lemmas = tuple(word.replace("_", " ") for word in words)
    cursor = 4 + 2 * word_count
    fields = tokens[cursor + 1 : cursor + 1 + 4 * int(tokens[cursor])]
    pointers = tuple(
        Pointer(symbol, ("a" if pos == "s" else pos) + offset, int(words_ab[:2], 16), int(words_ab[2:], 16))
        for symbol, offset, pos, words_ab in zip(
            fields[0::4], fields[1::4], fields[2::4], fields[3::4], strict=True
        )
    )
    gloss = gloss.strip().replace("`", "'")
    definition = gloss.split('"')[0].strip().rstrip(";").strip()
    examples = tuple(example.strip() for example in QUOTED.findall(gloss))
    return Synset(
        pos_file + tokens[0],
        pos_file,
        LEXNAMES[int(tokens[1])],
        lemmas,
        pointers,
        definition,
        examples,
    )


def _load_inflections(directory: Path) -> dict[str, tuple[str, ...]]:
    forms: dict[str, list[str]] = {}
    for name in ("noun.exc", "verb.exc", "adj.exc"):
        path = directory / name
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                inflected, *bases = line.split()
                for base in bases:
                    forms.setdefault(base.replace("_", " "), []).append(inflected.replace("_", " "))
    return {base: tuple(sorted(values)) for base, values in sorted(forms.items())}


def meaning(synset: Synset) -> str:
    """The gloss read as a predicate: verb glosses ('move fast') need a leading 'to'."""
    return (
        f"to {synset.definition}"
        if synset.pos == "v" and not synset.definition.startswith("to ")
        else synset.definition
    )


def sentence(text: str) -> str:
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text[-1] in ".!?" else ".")


def familiar_synsets(wn: WordNet, *pos: str) -> Iterator[tuple[Synset, str]]:
    """Familiar synsets with an unambiguous lemma; nouns first, so a noun sense wins a shared key."""
    for key in sorted(wn.familiar, key=lambda key: ("nvar".index(key[0]), key)):
        synset = wn.synsets[key]
        lemma = wn.primary_lemma(synset) if synset.pos in pos and synset.definition else None
        if lemma:
            yield synset, lemma


TOKEN = re.compile(r"[a-z][a-z'-]*")
