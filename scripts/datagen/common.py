"""What every generator shares: seed, splits, row shapes, stable splitting, shuffling, writing.

The files are byte-for-byte reproducible: seeded ``random.Random`` instances, sorted iteration
(never over sets, whose order depends on PYTHONHASHSEED) and gzip with mtime=0.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
from collections.abc import Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

SEED = 20240501
SPLITS = ("train", "validation", "test", "public")
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "src" / "fedtune" / "data" / "builtin"
YES_NO = ["no", "yes"]
CHOICE_METRICS = ["acc", "acc_norm"]

Row = dict[str, Any]


def write_jsonl_gz(path: Path, rows: list[Row]) -> None:
    payload = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    buffer = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of anything that varies between runs.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as handle:
        handle.write(payload)
    path.write_bytes(buffer.getvalue())


def write_dataset(
    out_dir: Path,
    meta: Mapping[str, object],
    splits: dict[str, list[Row]],
    notice: str,
    generator: str = "scripts/make_datasets.py",
) -> None:
    """``out_dir/<name>/``: the split files, ``meta.json`` (``meta`` plus categories and counts) and
    ``NOTICE``."""
    target = out_dir / str(meta["name"])
    target.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        write_jsonl_gz(target / f"{split}.jsonl.gz", rows)
    categories = sorted({row["category"] for rows in splits.values() for row in rows})
    meta = {
        **meta,
        "categories": categories,
        "splits": {split: len(rows) for split, rows in splits.items()},
        "category_counts": {
            split: {cat: sum(row["category"] == cat for row in rows) for cat in categories}
            for split, rows in splits.items()
        },
        "generator": generator,
        "seed": SEED,
    }
    (target / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    (target / "NOTICE").write_text(notice)
    print(f"{target}: {meta['splits']}")


def make_row(instruction: str, output: str, category: str, input_text: str = "") -> Row:
    """A JSONL row; ``finalise`` numbers it once the split is shuffled."""
    return {
        "id": "",
        "instruction": instruction,
        "input": input_text,
        "output": output,
        "category": category,
    }


def make_choice_row(
    instruction: str, choices: list[str], label: int, category: str, input_text: str = ""
) -> Row:
    """A multiple-choice row: ``output`` is the right choice, so fine-tuning learns what is scored."""
    if not prefix_free(choices):
        raise ValueError(f"choices {choices} are not prefix-free")
    return {**make_row(instruction, choices[label], category, input_text), "choices": choices, "label": label}


def prefix_free(choices: list[str]) -> bool:
    """No choice starts another (or repeats it): scored by summed log-likelihood after the same
    prompt, "4" would beat "42" whenever the model liked "42"."""
    return not any(
        index != other and second.startswith(first)
        for index, first in enumerate(choices)
        for other, second in enumerate(choices)
    )


def split_of(namespace: str, anchor: str, fractions: tuple[float, ...]) -> str:
    """Stable split for an anchor (a synset, a function): everything about one anchor lands in one
    split. ``namespace`` (the dataset's name) makes each dataset's draw independent."""
    digest = hashlib.sha256(f"{namespace}:{anchor}".encode()).hexdigest()
    position = int(digest[:12], 16) / 16**12
    for split, cumulative in zip(SPLITS, accumulate(fractions), strict=True):
        if position < cumulative:
            return split
    return SPLITS[-1]


def finalise(splits: dict[str, list[Row]], prefix: str, rng: random.Random) -> dict[str, list[Row]]:
    """Shuffle categories together and number the rows; ids carry the split so they never collide."""
    for split, rows in splits.items():
        rng.shuffle(rows)
        for index, row in enumerate(rows):
            row["id"] = f"{prefix}-{split}-{index:05d}"
    return splits


def with_article(word: str) -> str:
    """The word after "a" or "an", chosen by its sound ("an hour", "a unit")."""
    lowered = word.lower()
    vowel_sound = lowered[0] in "aeiou" and not lowered.startswith(("uni", "use", "usu", "eu", "one"))
    vowel_sound = vowel_sound or lowered.startswith(("hour", "honest", "honor", "heir"))
    return f"{'an' if vowel_sound else 'a'} {word}"
