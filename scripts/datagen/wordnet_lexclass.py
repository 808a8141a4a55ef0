"""``wordnet-lexclass``: gloss -> lexicographer class, for encoder classifiers."""

from __future__ import annotations

import random

from datagen.common import SEED, SPLITS, Row, finalise, make_row
from datagen.wordnet import WORDNET_SOURCE, WordNet

LEXCLASS_EXCLUDED = ("noun.Tops", "noun.motive")  # 51 and 42 synsets: too few to split four ways
LEXCLASS_EVAL_PER_CLASS = 42
LEXCLASS_TRAIN_PER_CLASS = 440


META: dict[str, object] = {
    "name": "wordnet-lexclass",
    "task": "classification",
    "licence": "WordNet-3.0",
    "description": "Noun '<word>: <gloss>' texts labelled with their WordNet lexicographer class "
    "(24 classes); output = category = label.",
    "source": WORDNET_SOURCE,
    "metrics": ["accuracy", "macro_f1"],
}


def build_wordnet_lexclass(wn: WordNet) -> dict[str, list[Row]]:
    by_class: dict[str, list[Row]] = {}
    seen_text: set[str] = set()
    for synset in wn.synsets.values():
        if synset.pos != "n" or synset.lexname in LEXCLASS_EXCLUDED or not synset.definition:
            continue
        text = f"{synset.lemmas[0]}: {synset.definition}"
        if text not in seen_text:
            seen_text.add(text)
            by_class.setdefault(synset.lexname, []).append(make_row(text, synset.lexname, synset.lexname))
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    for label in sorted(by_class):
        rows = by_class[label]
        random.Random(f"{SEED}:wordnet-lexclass:{label}").shuffle(rows)
        # Evaluation splits are balanced across classes; train keeps the natural shortfall of small classes.
        cursor = 0
        for split in ("validation", "test", "public"):
            splits[split].extend(rows[cursor : cursor + LEXCLASS_EVAL_PER_CLASS])
            cursor += LEXCLASS_EVAL_PER_CLASS
        splits["train"].extend(rows[cursor : cursor + LEXCLASS_TRAIN_PER_CLASS])
    return finalise(splits, "wlc", random.Random(f"{SEED}:wordnet-lexclass:order"))
