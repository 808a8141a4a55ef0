"""``wordnet-instruct``: instruction following over WordNet 3.0 (10 task categories)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from datagen.common import SEED, SPLITS, Row, finalise, make_row, split_of, with_article
from datagen.wordnet import (
    CLEAN_LEMMA,
    POS_NAMES,
    WORDNET_SOURCE,
    Synset,
    WordNet,
    familiar_synsets,
    meaning,
    sentence,
)


@dataclass(slots=True)
class Item:
    """One question before phrasing: ``slots`` fill the category's templates."""

    anchor: str  # synset that decides the split
    key: str  # what the question is about; one item per (category, key)
    group: str  # template group
    slots: dict[str, str]
    output: str


TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "definition": [
        ("What does the word '{w}' mean?", ""),
        ("Define '{w}'.", ""),
        ("Give a short definition of the {pos} '{w}'.", ""),
        ("Explain the meaning of this word.", "{w}"),
        ("What is the meaning of '{w}' when it is used as {a_pos}?", ""),
    ],
    "synonyms": [
        ("Give a synonym for '{w}'.", ""),
        ("What is another word for '{w}'?", ""),
        ("List words that mean the same as '{w}'.", ""),
        ("Suggest a word with the same meaning as the word below.", "{w}"),
        ("Which words could replace '{w}' without changing the meaning?", ""),
    ],
    "antonyms": [
        ("What is the opposite of '{w}'?", ""),
        ("Give an antonym for '{w}'.", ""),
        ("Name a word that means the opposite of '{w}'.", ""),
        ("Write the antonym of the following word.", "{w}"),
    ],
    "hypernyms/noun": [
        ("What kind of thing is '{w}'?", ""),
        ("'{w}' is a type of what?", ""),
        ("Name a broader category that includes '{w}'.", ""),
        ("Give the general category of the following term.", "{w}"),
    ],
    "hypernyms/verb": [
        ("What is a more general way of saying '{w}'?", ""),
        ("Give a more general verb for '{w}'.", ""),
        ("To '{w}' is a way of doing what?", ""),
        ("Name a broader verb that covers the following one.", "{w}"),
    ],
    "hyponyms/noun": [
        ("Name some kinds of '{w}'.", ""),
        ("Give examples of types of '{w}'.", ""),
        ("What are some specific kinds of '{w}'?", ""),
        ("List a few examples of the following category.", "{w}"),
    ],
    "hyponyms/verb": [
        ("Name some specific ways to '{w}'.", ""),
        ("What are more specific verbs for '{w}'?", ""),
        ("List verbs that describe particular ways to do the following.", "{w}"),
    ],
    "meronyms/part": [
        ("Name some parts of '{w}'.", ""),
        ("What parts does '{w}' have?", ""),
        ("List the components of the following.", "{w}"),
    ],
    "meronyms/member": [
        ("What are the members of '{w}'?", ""),
        ("Name some members of '{w}'.", ""),
        ("List what the following group is made up of.", "{w}"),
    ],
    "meronyms/substance": [
        ("What is '{w}' made of?", ""),
        ("Name a substance found in '{w}'.", ""),
        ("What material does the following consist of?", "{w}"),
    ],
    "meronyms/whole": [
        ("What is '{w}' a part of?", ""),
        ("'{w}' is a part of what?", ""),
        ("Name the whole that the following is a part of.", "{w}"),
    ],
    "usage": [
        ("Write a sentence using the word '{w}'.", ""),
        ("Use '{w}' in a sentence.", ""),
        ("Give an example sentence with the {pos} '{w}'.", ""),
        ("Show how the following word is used in a sentence.", "{w}"),
        ("How would you use '{w}' in a sentence?", ""),
    ],
    "part_of_speech": [
        ("What part of speech is '{w}'?", ""),
        ("Is '{w}' a noun, a verb, an adjective or an adverb?", ""),
        ("Identify the part of speech of the following word.", "{w}"),
        ("Which word class does '{w}' belong to?", ""),
    ],
    "reverse_dictionary": [
        ('Which word means "{definition}"?', ""),
        ("What is the word for {definition}?", ""),
        ("Give the single {pos} that matches this definition.", "{definition}"),
        ("Find the word that fits this description.", "{definition}"),
        ("I am looking for {a_pos} that means: {definition}. What is it?", ""),
    ],
    "compare": [
        ("What is the difference between '{a}' and '{b}'?", ""),
        ("How does '{a}' differ from '{b}'?", ""),
        ("Compare '{a}' and '{b}'.", ""),
        ("Explain the difference between these two words.", "{a}, {b}"),
    ],
}

INSTRUCT_FRACTIONS = (0.7, 0.08, 0.08, 0.14)
INSTRUCT_CAPS = {"train": 1600, "validation": 100, "test": 100, "public": 200}
POS_POOL_PER_CLASS = 700


def join_words(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def word_slots(lemma: str, synset: Synset) -> dict[str, str]:
    pos = POS_NAMES[synset.pos]
    return {"w": lemma, "pos": pos, "a_pos": with_article(pos), "definition": synset.definition}


def clean_first_lemmas(wn: WordNet, keys: list[str], limit: int) -> list[str]:
    """First clean lemma of each synset, familiar synsets first, without repeats."""
    chosen: list[str] = []
    ordered = sorted(keys, key=lambda key: (not wn.is_familiar(wn.synsets[key]), key))
    for key in ordered:
        lemma = next((lemma for lemma in wn.synsets[key].lemmas if CLEAN_LEMMA.match(lemma)), None)
        if lemma and lemma not in chosen:
            chosen.append(lemma)
    return chosen[:limit]


def definition_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n", "v", "a", "r"):
        output = f"As {with_article(POS_NAMES[synset.pos])}, '{lemma}' means {meaning(synset)}."
        yield Item(synset.key, lemma.lower(), "definition", word_slots(lemma, synset), output)


def synonym_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n", "v", "a", "r"):
        others = [
            other for other in synset.lemmas if other.lower() != lemma.lower() and CLEAN_LEMMA.match(other)
        ][:4]
        if others:
            quoted = [f"'{other}'" for other in others]
            output = (
                f"A synonym of '{lemma}' is {quoted[0]}."
                if len(others) == 1
                else f"Synonyms of '{lemma}' include {join_words(quoted)}."
            )
            yield Item(synset.key, lemma.lower(), "synonyms", word_slots(lemma, synset), output)


def antonym_items(wn: WordNet) -> Iterator[Item]:
    for synset in wn.synsets.values():
        for pointer in synset.pointers:
            if pointer.symbol != "!" or not wn.is_familiar(synset):
                continue
            lemma = synset.lemmas[pointer.source_word - 1]
            opposite = wn.synsets[pointer.target].lemmas[pointer.target_word - 1]
            if CLEAN_LEMMA.match(lemma) and CLEAN_LEMMA.match(opposite):
                anchor = min(synset.key, pointer.target)  # both directions of a pair share a split
                output = f"The opposite of '{lemma}' is '{opposite}'."
                yield Item(anchor, lemma.lower(), "antonyms", word_slots(lemma, synset), output)


def hypernym_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n", "v"):
        parents = synset.related("@", "@i")
        broader = clean_first_lemmas(wn, parents, 1)
        if not broader:
            continue
        if synset.pos == "v":
            output = f"To {lemma} is a way to {broader[0]}."
        elif synset.related("@i"):
            output = f"{lemma} is {with_article(broader[0])}."
        else:
            output = f"'{lemma}' is a kind of {broader[0]}."
        group = "hypernyms/verb" if synset.pos == "v" else "hypernyms/noun"
        # Anchored on the parent, so "kinds of X" and "what kind of thing is Y (an X)" share a split.
        yield Item(parents[0], f"{synset.pos}:{lemma.lower()}", group, word_slots(lemma, synset), output)


def hyponym_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n", "v"):
        kinds = clean_first_lemmas(wn, synset.related("~", "~i"), 4)
        if len(kinds) < 2:
            continue
        if synset.pos == "v":
            output = f"Specific ways to {lemma} include {join_words(kinds)}."
        else:
            output = f"Kinds of {lemma} include {join_words(kinds)}."
        group = "hyponyms/verb" if synset.pos == "v" else "hyponyms/noun"
        yield Item(synset.key, f"{synset.pos}:{lemma.lower()}", group, word_slots(lemma, synset), output)


MERONYM_RELATIONS = (
    ("%p", "part", "Parts of '{w}' include {x}."),
    ("%m", "member", "Members of '{w}' include {x}."),
    ("%s", "substance", "'{w}' is made of {x}."),
)


def meronym_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n"):
        for symbol, group, phrase in MERONYM_RELATIONS:
            parts = clean_first_lemmas(wn, synset.related(symbol), 4)
            if parts:
                output = phrase.format(w=lemma, x=join_words(parts))
                yield Item(
                    synset.key,
                    f"{group}:{lemma.lower()}",
                    f"meronyms/{group}",
                    word_slots(lemma, synset),
                    output,
                )
        wholes = synset.related("#p")
        whole = clean_first_lemmas(wn, wholes, 1)
        if whole:
            output = f"'{lemma}' is a part of {with_article(whole[0]) if whole[0].islower() else whole[0]}."
            yield Item(
                wholes[0], f"whole:{lemma.lower()}", "meronyms/whole", word_slots(lemma, synset), output
            )


def uses_word(example: str, lemma: str, wn: WordNet) -> bool:
    """Whether the sentence contains the lemma, allowing regular and irregular inflections."""
    head, *rest = lemma.lower().split()
    stem = head[:-1] if len(head) > 3 and head[-1] in "ey" else head
    forms = wn.inflections.get(head, ())
    tokens = re.findall(r"[a-z'-]+", example.lower())
    return any(
        (token.startswith(stem) or token in forms) and tokens[index + 1 : index + 1 + len(rest)] == rest
        for index, token in enumerate(tokens)
    )


def usage_items(wn: WordNet) -> Iterator[Item]:
    for synset in wn.synsets.values():
        for example in synset.examples:
            if len(example.split()) < 6 or not wn.is_familiar(synset):
                continue  # WordNet examples are often fragments ("a big house"), not sentences
            lemma = next(
                (
                    lemma
                    for lemma in synset.lemmas
                    if CLEAN_LEMMA.match(lemma) and uses_word(example, lemma, wn)
                ),
                None,
            )
            if lemma:
                yield Item(synset.key, lemma.lower(), "usage", word_slots(lemma, synset), sentence(example))
                break


def part_of_speech_items(wn: WordNet) -> Iterator[Item]:
    by_pos: dict[str, list[Item]] = {pos: [] for pos in POS_NAMES}
    pos_count: dict[str, int] = {}
    for lemma, _ in wn.senses:
        pos_count[lemma] = pos_count.get(lemma, 0) + 1
    for (lemma, pos), keys in wn.senses.items():
        if pos_count[lemma] == 1 and wn.tagged[lemma, pos] > 0 and CLEAN_LEMMA.match(lemma):
            synset = wn.synsets[keys[0]]
            output = f"'{lemma}' is {with_article(POS_NAMES[pos])}."
            by_pos[pos].append(Item(synset.key, lemma, "part_of_speech", word_slots(lemma, synset), output))
    # Equal pools per word class, else nouns would make up most of the answers.
    for pos, items in by_pos.items():
        random.Random(f"{SEED}:part_of_speech:{pos}").shuffle(items)
        yield from items[:POS_POOL_PER_CLASS]


def reverse_dictionary_items(wn: WordNet) -> Iterator[Item]:
    for synset, lemma in familiar_synsets(wn, "n", "v", "a", "r"):
        if " " not in lemma and len(synset.definition.split()) >= 3:
            yield Item(
                synset.key,
                synset.key,
                "reverse_dictionary",
                word_slots(lemma, synset),
                f"The word is '{lemma}'.",
            )


def compare_items(wn: WordNet) -> Iterator[Item]:
    for parent, parent_lemma in familiar_synsets(wn, "n", "v"):
        children = [wn.synsets[key] for key in parent.related("~")]
        named = [(child, wn.primary_lemma(child)) for child in children if wn.is_familiar(child)]
        usable = [(child, lemma) for child, lemma in named if lemma]
        for (first, a), (second, b) in zip(usable[::2], usable[1::2], strict=False):
            kind = f"ways to {parent_lemma}" if parent.pos == "v" else f"kinds of {parent_lemma}"
            output = f"Both are {kind}. '{a}' means {meaning(first)}, while '{b}' means {meaning(second)}."
            yield Item(parent.key, f"{a.lower()}|{b.lower()}", "compare", {"a": a, "b": b}, output)


INSTRUCT_BUILDERS: dict[str, Callable[[WordNet], Iterator[Item]]] = {
    "definition": definition_items,
    "synonyms": synonym_items,
    "antonyms": antonym_items,
    "hypernyms": hypernym_items,
    "hyponyms": hyponym_items,
    "meronyms": meronym_items,
    "usage": usage_items,
    "part_of_speech": part_of_speech_items,
    "reverse_dictionary": reverse_dictionary_items,
    "compare": compare_items,
}


META: dict[str, object] = {
    "name": "wordnet-instruct",
    "task": "generation",
    "licence": "WordNet-3.0",
    "description": "General instruction following about English words (definitions, synonyms, "
    "antonyms, hypernyms, usage, ...); category = task type, for non-IID splits.",
    "source": WORDNET_SOURCE,
    "metrics": ["rougeL", "exact_match"],
}


def build_wordnet_instruct(wn: WordNet) -> dict[str, list[Row]]:
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    seen_text: set[tuple[str, str]] = set()
    for category, builder in INSTRUCT_BUILDERS.items():
        rng = random.Random(f"{SEED}:wordnet-instruct:{category}")
        items = unique_by_key(builder(wn))
        rng.shuffle(items)
        taken = {split: 0 for split in SPLITS}
        for item in items:
            split = split_of("wordnet-instruct", item.anchor, INSTRUCT_FRACTIONS)
            if taken[split] >= INSTRUCT_CAPS[split]:
                continue
            instruction, input_template = rng.choice(TEMPLATES[item.group])
            text = (instruction.format(**item.slots), input_template.format(**item.slots))
            if text in seen_text:
                continue
            seen_text.add(text)
            taken[split] += 1
            splits[split].append(make_row(text[0], item.output, category, text[1]))
    return finalise(splits, "wni", random.Random(f"{SEED}:wordnet-instruct:order"))


def unique_by_key(items: Iterator[Item]) -> list[Item]:
    """First item per key: builders yield the most frequent sense of a word first."""
    unique: dict[str, Item] = {}
    for item in items:
        unique.setdefault(item.key, item)
    return list(unique.values())
