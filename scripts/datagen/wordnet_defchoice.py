"""``wordnet-defchoice``: which of 4 definitions fits a word."""

from __future__ import annotations

import random
from dataclasses import dataclass

from datagen.common import CHOICE_METRICS, SEED, SPLITS, Row, finalise, make_choice_row, prefix_free, split_of
from datagen.wordnet import (
    POS_NAMES,
    TOKEN,
    WORDNET_SOURCE,
    Synset,
    WordNet,
    familiar_synsets,
    meaning,
)

DEFCHOICE_FRACTIONS = (0.64, 0.12, 0.12, 0.12)
# Per part of speech; adverbs fall short (most adverb glosses spell out their adjective).
DEFCHOICE_PER_CATEGORY = {"train": 1250, "validation": 150, "test": 150, "public": 150}
DEFCHOICE_CHOICES = 4
DEFCHOICE_MIN_POOL = 20
DEFCHOICE_TEMPLATES = (
    "What does the {pos} '{w}' mean?",
    "What is the meaning of the {pos} '{w}'?",
    "Define the {pos} '{w}'.",
    "Give the definition of the {pos} '{w}'.",
)


@dataclass(slots=True)
class Sense:
    synset: Synset
    lemma: str
    definition: str


def definition_senses(wn: WordNet) -> dict[str, list[Sense]]:
    """Familiar senses with an unambiguous word, by split (anchored on the synset).

    Definitions that spell out the word ("gratifyingly": "in a gratifying manner") are left out:
    they would be answered by string matching.
    """
    by_split: dict[str, list[Sense]] = {split: [] for split in SPLITS}
    seen: set[str] = set()
    for synset, lemma in familiar_synsets(wn, "n", "v", "a", "r"):
        definition = meaning(synset)
        if (
            len(synset.definition.split()) >= 2
            and definition not in seen
            and not shares_a_stem(lemma, definition)
        ):
            seen.add(definition)
            split = split_of("wordnet-defchoice", synset.key, DEFCHOICE_FRACTIONS)
            by_split[split].append(Sense(synset, lemma, definition))
    return by_split


def shares_a_stem(word: str, text: str) -> bool:
    """Whether a word of ``text`` starts like a word of ``word`` (their first five letters, or all
    of a shorter one)."""
    stems = [token[:5] for token in TOKEN.findall(word.lower())]
    return any(token.startswith(stem) for token in TOKEN.findall(text.lower()) for stem in stems)


def definition_distractors(sense: Sense, pool: list[Sense], rng: random.Random) -> list[str]:
    """Definitions of other words of the same part of speech (and lexicographer file, where it has
    enough of them) in the same split; never a sense the word itself has, never a prefix clash."""
    word = sense.lemma.lower()
    same_file = [other for other in pool if other.synset.lexname == sense.synset.lexname]
    candidates = same_file if len(same_file) >= DEFCHOICE_MIN_POOL else pool
    chosen: list[str] = []
    for other in rng.sample(candidates, len(candidates)):
        if word in (lemma.lower() for lemma in other.synset.lemmas):
            continue
        if prefix_free([sense.definition, *chosen, other.definition]):
            chosen.append(other.definition)
            if len(chosen) == DEFCHOICE_CHOICES - 1:
                return chosen
    raise RuntimeError(f"too few distractors for '{sense.lemma}' ({sense.synset.key})")


META: dict[str, object] = {
    "name": "wordnet-defchoice",
    "task": "multiple_choice",
    "licence": "WordNet-3.0",
    "description": "Which definition fits a word (its most frequent sense): 4 definitions, the "
    "others of other words of the same part of speech and lexicographer file, never of a sense "
    "of the word; labels balanced over positions; category = part of speech.",
    "source": WORDNET_SOURCE,
    "metrics": CHOICE_METRICS,
    "num_choices": DEFCHOICE_CHOICES,
}


def build_wordnet_defchoice(wn: WordNet) -> dict[str, list[Row]]:
    rng = random.Random(f"{SEED}:wordnet-defchoice")
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    for split, senses in definition_senses(wn).items():
        for pos in POS_NAMES:
            pool = [sense for sense in senses if sense.synset.pos == pos]
            for index, sense in enumerate(rng.sample(pool, min(len(pool), DEFCHOICE_PER_CATEGORY[split]))):
                options = definition_distractors(sense, pool, rng)
                # The right definition takes each position in turn: balanced labels.
                label = index % DEFCHOICE_CHOICES
                options.insert(label, sense.definition)
                category = POS_NAMES[pos]
                instruction = rng.choice(DEFCHOICE_TEMPLATES).format(w=sense.lemma, pos=category)
                splits[split].append(make_choice_row(instruction, options, label, category))
    return finalise(splits, "wdc", random.Random(f"{SEED}:wordnet-defchoice:order"))
