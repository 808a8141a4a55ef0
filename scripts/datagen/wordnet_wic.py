"""``wordnet-wic``: does a word mean the same in two sentences? (no / yes)"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from datagen.common import CHOICE_METRICS, SEED, SPLITS, YES_NO, Row, finalise, make_choice_row, split_of
from datagen.wordnet import (
    CLEAN_LEMMA,
    POS_NAMES,
    TOKEN,
    WORDNET_SOURCE,
    Synset,
    WordNet,
    sentence,
)

WIC_FRACTIONS = (0.7, 0.1, 0.1, 0.1)
# Per part of speech and per answer; adverbs have fewer examples and fall short.
WIC_PER_CATEGORY = {"train": 700, "validation": 100, "test": 100, "public": 100}
WIC_NEGATIVES_PER_WORD = 2
WIC_TEMPLATES = (
    "Is the word '{w}' used with the same meaning in both sentences? Answer yes or no.",
    "Does the {pos} '{w}' mean the same thing in the two sentences below? Answer yes or no.",
    "Here are two sentences that use the word '{w}'. Is it used in the same sense in both? Answer yes or no.",
)


def word_forms(word: str, wn: WordNet) -> frozenset[str]:
    """The word and its regular and irregular inflections ("run": runs, running, ran, ...)."""
    endings = ("s", "es", "ed", "d", "ing", "er", "est")
    forms = {word, *(word + ending for ending in endings), *wn.inflections.get(word, ())}
    if word.endswith("e"):
        forms |= {word[:-1] + ending for ending in ("ing", "ed", "er", "est")}
    if word.endswith("y"):
        forms |= {word[:-1] + ending for ending in ("ies", "ied", "ier", "iest")}
    if word[-1] not in "aeiouwxy":
        forms |= {word + word[-1] + ending for ending in ("ed", "ing", "er", "est")}
    return frozenset(forms)


def mentions(text: str, lemma: str, wn: WordNet) -> bool:
    """Whether the text uses the lemma as a whole word (inflected or not; multiword lemmas in a row).

    Stricter than ``wordnet_instruct.uses_word``: a sense question must point at the word itself,
    not at "article" for "art".
    """
    head, *rest = lemma.lower().split()
    forms = word_forms(head, wn)
    tokens = [token.removesuffix("'s").rstrip("'") for token in TOKEN.findall(text.lower())]
    return any(
        token in forms and tokens[index + 1 : index + 1 + len(rest)] == rest
        for index, token in enumerate(tokens)
    )


def sense_examples(wn: WordNet, lemma: str, pos: str) -> list[tuple[Synset, list[str]]]:
    """Each sense of the word with the example sentences that use the word itself."""
    senses = []
    for key in wn.senses[lemma, pos]:
        synset = wn.synsets[key]
        examples = [sentence(text) for text in synset.examples if len(text.split()) >= 3]
        usable = sorted({text for text in examples if mentions(text, lemma, wn)})
        if usable:
            senses.append((synset, usable))
    return senses


def close_senses(first: Synset, second: Synset) -> bool:
    """Senses too close to call different, as WiC prunes them: linked by any pointer, or sharing a
    direct hypernym or (adjectives) the head of their similarity cluster."""
    linked = any(p.target == second.key for p in first.pointers) or any(
        p.target == first.key for p in second.pointers
    )
    parents = set(first.related("@", "@i", "&")) & set(second.related("@", "@i", "&"))
    return linked or bool(parents)


@dataclass(slots=True)
class SensePair:
    split: str
    category: str
    lemma: str
    sentences: tuple[str, str]
    same: bool


def wic_pairs(wn: WordNet) -> Iterator[SensePair]:
    """Per word: one same-sense pair per sense with two examples, a few different-sense pairs."""
    rng = random.Random(f"{SEED}:wordnet-wic:pairs")
    for lemma, pos in sorted(wn.senses):
        if not CLEAN_LEMMA.match(lemma):
            continue
        senses = sense_examples(wn, lemma, pos)
        split = split_of("wordnet-wic", f"{pos}:{lemma}", WIC_FRACTIONS)
        for _, examples in senses:
            if len(examples) >= 2:
                first, second = rng.sample(examples, 2)
                yield SensePair(split, POS_NAMES[pos], lemma, (first, second), True)
        apart = [
            (first, second)
            for index, first in enumerate(senses)
            for second in senses[index + 1 :]
            if not close_senses(first[0], second[0])
        ]
        for (_, examples), (_, others) in rng.sample(apart, min(len(apart), WIC_NEGATIVES_PER_WORD)):
            pair = [rng.choice(examples), rng.choice(others)]
            rng.shuffle(pair)
            if pair[0] != pair[1]:
                yield SensePair(split, POS_NAMES[pos], lemma, (pair[0], pair[1]), False)


META: dict[str, object] = {
    "name": "wordnet-wic",
    "task": "multiple_choice",
    "licence": "WordNet-3.0",
    "description": "WiC-style word sense pairs: does a word mean the same in two WordNet example "
    "sentences? choices ['no', 'yes'], balanced per part of speech; close senses (linked, or "
    "sharing a hypernym) are never a 'no'; category = part of speech of the word.",
    "source": WORDNET_SOURCE,
    "metrics": CHOICE_METRICS,
    "num_choices": 2,
}


def build_wordnet_wic(wn: WordNet) -> dict[str, list[Row]]:
    grouped: dict[tuple[str, str, bool], list[SensePair]] = {}
    sentence_split: dict[str, str] = {}
    for pair in wic_pairs(wn):
        # A sentence that serves two words (synonyms share examples) stays in the split it met first.
        if any(sentence_split.setdefault(text, pair.split) != pair.split for text in pair.sentences):
            continue
        grouped.setdefault((pair.split, pair.category, pair.same), []).append(pair)
    rng = random.Random(f"{SEED}:wordnet-wic")
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    categories = sorted({category for _, category, _ in grouped})
    for split in SPLITS:
        for category in categories:
            same, different = (
                grouped.get((split, category, True), []),
                grouped.get((split, category, False), []),
            )
            # As many same-sense as different-sense pairs in every part of speech: "yes" is half.
            count = min(len(same), len(different), WIC_PER_CATEGORY[split])
            for pair in rng.sample(same, count) + rng.sample(different, count):
                instruction = rng.choice(WIC_TEMPLATES).format(w=pair.lemma, pos=pair.category)
                input_text = f"1. {pair.sentences[0]}\n2. {pair.sentences[1]}"
                splits[split].append(
                    make_choice_row(instruction, YES_NO, int(pair.same), category, input_text)
                )
    return finalise(splits, "wic", random.Random(f"{SEED}:wordnet-wic:order"))
