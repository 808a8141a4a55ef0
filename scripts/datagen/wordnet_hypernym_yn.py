"""``wordnet-hypernym-yn``: "Is 'X' a kind of Y?" (no / yes)."""

from __future__ import annotations

import random

from datagen.common import CHOICE_METRICS, SEED, SPLITS, YES_NO, Row, finalise, make_choice_row, split_of
from datagen.wordnet import CLEAN_LEMMA, WORDNET_SOURCE, Synset, WordNet, familiar_synsets, meaning

HYPERNYM_FRACTIONS = (0.7, 0.1, 0.1, 0.1)
HYPERNYM_WORDS = {"train": 2500, "validation": 250, "test": 250, "public": 250}
HYPERNYM_MIN_DEPTH = 4  # below: "entity", "abstraction", "whole", ... (too vague to ask about)
HYPERNYM_MAX_DISTANCE = 3


class Taxonomy:
    """The noun hypernym graph: ancestors and depths, memoised."""

    def __init__(self, wn: WordNet) -> None:
        self.wn = wn
        self._ancestors: dict[str, frozenset[str]] = {}
        self._depths: dict[str, int] = {}

    def parents(self, key: str) -> list[str]:
        return self.wn.synsets[key].related("@", "@i")

    def ancestors(self, key: str) -> frozenset[str]:
        if key not in self._ancestors:
            found: set[str] = set()
            for parent in self.parents(key):
                found |= {parent, *self.ancestors(parent)}
            self._ancestors[key] = frozenset(found)
        return self._ancestors[key]

    def depth(self, key: str) -> int:
        """Fewest hypernym steps up to a root ("entity")."""
        if key not in self._depths:
            parents = self.parents(key)
            self._depths[key] = 1 + min(self.depth(parent) for parent in parents) if parents else 0
        return self._depths[key]

    def within(self, key: str, distance: int) -> list[str]:
        """Ancestors at most ``distance`` steps up, nearest first, each once."""
        levels, found = [key], []
        for _ in range(distance):
            levels = [parent for level in levels for parent in self.parents(level) if parent not in found]
            found += sorted(set(levels))
        return found


def category_word(wn: WordNet, key: str) -> str | None:
    """A plain lowercase word for a familiar noun synset, to ask "is X a kind of <word>?"."""
    synset = wn.synsets[key]
    if not wn.is_familiar(synset):
        return None
    return next((lemma for lemma in synset.lemmas if CLEAN_LEMMA.match(lemma) and lemma.islower()), None)


def kind_of_any_sense(wn: WordNet, taxonomy: Taxonomy, word: str, category: str) -> bool:
    """Whether some noun sense of ``word`` is (a kind of) some noun sense of ``category``."""
    categories = set(wn.senses.get((category.lower(), "n"), ()))
    return any(
        categories & (taxonomy.ancestors(key) | {key}) for key in wn.senses.get((word.lower(), "n"), ())
    )


def shares_a_word(first: str, second: str) -> bool:
    return bool(set(first.lower().split()) & set(second.lower().split()))


def hypernym_question(
    wn: WordNet, taxonomy: Taxonomy, synset: Synset, lemma: str, rng: random.Random
) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """``((category word, its key), (non-category word, its key))`` for the noun, or None.

    The yes-category is an ancestor up to three steps up, the no-category one of its siblings that
    is no ancestor ("is 'dog' a kind of canine?" / "... of feline?"): equally specific, and never
    a category of any sense of the word.
    """
    above = taxonomy.ancestors(synset.key)
    pairs = []
    for key in taxonomy.within(synset.key, HYPERNYM_MAX_DISTANCE):
        word = category_word(wn, key)
        if taxonomy.depth(key) < HYPERNYM_MIN_DEPTH or not word or shares_a_word(word, lemma):
            continue
        siblings = sorted(
            {child for parent in taxonomy.parents(key) for child in wn.synsets[parent].related("~")}
        )
        for sibling in siblings:
            other = category_word(wn, sibling)
            if (
                other
                and sibling not in above
                and synset.key not in taxonomy.ancestors(sibling)
                and not shares_a_word(other, lemma)
                and not kind_of_any_sense(wn, taxonomy, lemma, other)
            ):
                pairs.append(((word, key), (other, sibling)))
    return rng.choice(pairs) if pairs else None


META: dict[str, object] = {
    "name": "wordnet-hypernym-yn",
    "task": "multiple_choice",
    "licence": "WordNet-3.0",
    "description": "BoolQ-like yes/no questions \"Is 'X' a kind of Y?\" with Y's definition as the "
    "passage: per noun one yes (a hypernym up to 3 steps up) and one no (a sibling of it that is no "
    "category of any sense of X); category = the noun's lexicographer file.",
    "source": WORDNET_SOURCE,
    "metrics": CHOICE_METRICS,
    "num_choices": 2,
}


def build_wordnet_hypernym_yn(wn: WordNet) -> dict[str, list[Row]]:
    taxonomy = Taxonomy(wn)
    rng = random.Random(f"{SEED}:wordnet-hypernym-yn")
    candidates: dict[str, list[tuple[Synset, str]]] = {split: [] for split in SPLITS}
    for synset, lemma in familiar_synsets(wn, "n"):
        # Common nouns only: "is Paris a kind of city?" is an instance, not a kind.
        if lemma.islower() and synset.related("@") and taxonomy.depth(synset.key) > HYPERNYM_MIN_DEPTH:
            candidates[split_of("wordnet-hypernym-yn", synset.key, HYPERNYM_FRACTIONS)].append(
                (synset, lemma)
            )
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    for split, nouns in candidates.items():
        taken = 0
        for synset, lemma in rng.sample(nouns, len(nouns)):
            question = hypernym_question(wn, taxonomy, synset, lemma, rng)
            if question is None:
                continue
            # One yes and one no per noun: balanced in every split and lexicographer file.
            for answer, (word, key) in zip((1, 0), question, strict=True):
                instruction = f"Is '{lemma}' a kind of {word}? Answer yes or no."
                context = f"{word}: {meaning(wn.synsets[key])}"
                splits[split].append(make_choice_row(instruction, YES_NO, answer, synset.lexname, context))
            taken += 1
            if taken == HYPERNYM_WORDS[split]:
                break
    return finalise(splits, "whn", random.Random(f"{SEED}:wordnet-hypernym-yn:order"))
