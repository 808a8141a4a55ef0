"""The MinED vocabulary map of FedMKT (Fan et al. 2024, App. B (a)): every source token -> the target token
of minimum edit distance, computed once per tokenizer pair and cached on disk.

Rule (on the canonical strings of `fedtune.align.tokens`): minimum Levenshtein distance; ties ->
the lexicographically smallest target string (Python ``str`` order), then, among the target ids
sharing that string, the one the target tokenizer writes for it (`preferred_ids`). An exact match is
the distance-0 case of the same rule, so a string present in the target maps to itself.

Several ids share a string in a SentencePiece vocabulary with byte fallback (Gemma, Llama-2,
Mistral): every printable ASCII character is a piece (``1``) and a byte token (``<0x31>``), and the
byte token comes first. The tokenizer writes the piece (``12`` -> ``1``, ``2``) and falls back to
bytes only for a character without a piece, so a map to the byte token would put projected knowledge
on an id the receiver never sees as a label. `preferred_ids` takes the id the tokenizer produces
when it encodes the string alone (one token in the group), else the smallest id that is not a byte
token, else the smallest id. The string-level map (ties among equal strings: the smallest id) is what
the disk cache holds; the choice among equal strings is applied after it, per target tokenizer.

Deviations from FATE-LLM's ``get_vocab_mappings`` (itself FuseLLM's): FATE-LLM breaks ties by the
order of ``tokenizer.get_vocab()`` (a dict's order, not specified); it maps token strings, so added
tokens are looked up by their text and ids sharing one string collapse; here the map is over ids.

Speed: `brute_force_vocab_map` is what FATE-LLM does (for each source token, a Python loop of an
edit distance call over the whole target vocabulary). `vocab_map` gives the same answer through a
compiled (numba) index of the target vocabulary, built in each call (`fedtune.align.vocab_index`
has the details and why nothing is missed): targets are numbered in tie-rule order (a sort on their
first three code points, then the runs of equal keys three code points at a time), so a tie is
settled by comparing two integers; per character feature ("at least j copies of c") a list of the
targets having it, by length then in that order, with a 64-bit signature of each one's characters.
A source is first looked up exactly (binary search in one list). Otherwise rounds k = 1, 2, ... read
only the lists that a prefix filter needs (a target within distance k has one of the source's k + 1
rarest features, at a length within k), pass over what a lower bound (the signature, then the
multiset of characters) puts above the best distance so far, keep for a later round what it puts
above k, and verify the rest with a bit-parallel edit distance; the search ends once the best
distance is at most k. A list read in the last round stops at the first target ranked after the best
(ties cost a few verifications, not thousands), and the targets sharing no character with the
source (distance ``max(L, len(t))``) are settled by one verification up front. ``workers`` threads
share the sources of a large call.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from fedtune.align.tokens import is_byte_token, tokenizer_family, vocabulary_strings
from fedtune.align.vocab_index import TargetIndex

FORMAT_VERSION = 1
"""Bump when the rule or the file layout changes: old cache files are then simply not found."""
_PROGRESS_EVERY = 32768


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_align_cache_dir() -> Path:
    from fedtune.models.zoo import default_cache_dir

    return default_cache_dir() / "align"


def nearest_targets(
    source_strings: Sequence[str], target_strings: Sequence[str], *, workers: int = 1, progress: bool = False
) -> np.ndarray:
    """For each source string, the target id of minimum edit distance by the module's tie rule [S]."""
    index = TargetIndex.build(target_strings)  # ValueError on an empty target vocabulary
    if not progress:
        return index.nearest(source_strings, workers=workers)
    result = np.empty(len(source_strings), dtype=np.int64)
    started = time.perf_counter()
    for start in range(0, len(source_strings), _PROGRESS_EVERY):
        stop = min(start + _PROGRESS_EVERY, len(source_strings))
        result[start:stop] = index.nearest(source_strings[start:stop], workers=workers)
        seconds = time.perf_counter() - started
        print(f"vocab map: {stop}/{len(source_strings)} source tokens, {seconds:.0f} s", file=sys.stderr)
    return result


def brute_force_vocab_map(
    source_strings: Sequence[str],
    target_strings: Sequence[str],
    source_ids: Sequence[int],
    preferred: np.ndarray | None = None,
) -> np.ndarray:
    """The reference: for each of ``source_ids``, one edit distance call per target string, then the
    tie rule over all of them (FATE-LLM's loop, plus the tie rule; among equal strings the smallest
    id, or ``preferred``'s choice when given). int64 [len(source_ids)]."""
    mapped = []
    for source_id in source_ids:
        text = source_strings[source_id]
        distances = [Levenshtein.distance(text, target) for target in target_strings]
        best = min(distances)
        mapped.append(
            min((target_strings[j], j) for j, distance in enumerate(distances) if distance == best)[1]
        )
    result = np.asarray(mapped, dtype=np.int64)
    return result if preferred is None else np.asarray(preferred, dtype=np.int64)[result]


def preferred_ids(tokenizer: Any, strings: Sequence[str] | None = None) -> np.ndarray:
    """int64 [len(tokenizer)]: each id -> the id that stands for its canonical string (``strings``,
    default `vocabulary_strings`). An id whose string no other id has stands for itself; among ids
    sharing a string: the one ``tokenizer`` writes for the string alone (when it writes one token of
    the group), else the smallest id that is not a byte-fallback token (``<0xHH>``), else the
    smallest id (module docstring)."""
    strings = vocabulary_strings(tokenizer) if strings is None else strings
    preferred = np.arange(len(strings), dtype=np.int64)
    groups: dict[str, list[int]] = {}
    for index, text in enumerate(strings):
        groups.setdefault(text, []).append(index)
    shared = {text: ids for text, ids in groups.items() if len(ids) > 1}
    if not shared:
        return preferred
    spm = tokenizer_family(tokenizer) == "sentencepiece"
    raw = tokenizer.convert_ids_to_tokens([i for ids in shared.values() for i in ids])
    is_byte = dict(
        zip(
            (i for ids in shared.values() for i in ids),
            (spm and token is not None and is_byte_token(token) for token in raw),
            strict=True,
        )
    )
    for text, ids in shared.items():
        chosen = None
        if text and not any(0xD800 <= ord(char) <= 0xDFFF for char in text):  # lone bytes cannot be encoded
            written = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(written) == 1 and int(written[0]) in ids:
                chosen = int(written[0])
        if chosen is None:
            pieces = [i for i in ids if not is_byte[i]]
            chosen = min(pieces or ids)
        preferred[ids] = chosen
    return preferred


def _vocab_key(source_strings: Sequence[str], target_strings: Sequence[str]) -> str:
    digest = hashlib.sha256(f"fedtune vocab map v{FORMAT_VERSION}".encode())
    for strings in (source_strings, target_strings):
        digest.update(len(strings).to_bytes(8, "little"))
        for text in strings:
            encoded = text.encode("utf-8", "surrogatepass")
            digest.update(len(encoded).to_bytes(4, "little") + encoded)
    return digest.hexdigest()


def _checksum(vmap: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(vmap, dtype="<i8").tobytes()).hexdigest()


def _read_cache(path: Path, num_source: int, num_target: int) -> np.ndarray | None:
    """The cached map, or None when there is none or it fails any check (with a warning)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            vmap = np.asarray(stored["vmap"], dtype=np.int64)
            checksum = str(stored["checksum"])
        intact = (
            vmap.shape == (num_source,)
            and checksum == _checksum(vmap)
            and (num_source == 0 or (vmap.min() >= 0 and vmap.max() < num_target))
        )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(f"vocab map cache {path} is unreadable ({err}); recomputing it", stacklevel=3)
        return None
    if not intact:
        warnings.warn(f"vocab map cache {path} is damaged; recomputing it", stacklevel=3)
        return None
    return vmap


def _write_cache(path: Path, vmap: np.ndarray) -> None:
    if path.exists() and not path.is_file():
        warnings.warn(
            f"vocab map cache {path} is not a file (a directory?): the map is used but not cached; "
            "remove it to cache the map again",
            stacklevel=3,
        )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the final name and renamed: a reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz.partial")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, vmap=vmap, checksum=np.asarray(_checksum(vmap)))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def vocab_map(
    source_tokenizer: Any,
    target_tokenizer: Any,
    *,
    cache_dir: Path | None = None,
    progress: bool = False,
) -> np.ndarray:
    """int64 [len(source_tokenizer)]: for every source id, the target id of minimum edit distance
    (module docstring). Read from ``cache_dir`` (default ``<fedtune cache>/align``) when a file for
    exactly these two vocabularies is there and intact; computed and stored otherwise."""
    source_strings = vocabulary_strings(source_tokenizer)
    target_strings = vocabulary_strings(target_tokenizer)
    preferred = preferred_ids(target_tokenizer, target_strings)
    return vocab_map_of_strings(
        source_strings, target_strings, cache_dir=cache_dir, progress=progress, preferred=preferred
    )


def cache_path(source_strings: Sequence[str], target_strings: Sequence[str], cache_dir: Path | None) -> Path:
    """Where the map of these two vocabularies is cached (whether or not it is there yet)."""
    return (cache_dir or default_align_cache_dir()) / f"{_vocab_key(source_strings, target_strings)}.npz"


def vocab_map_of_strings(
    source_strings: Sequence[str],
    target_strings: Sequence[str],
    *,
    cache_dir: Path | None = None,
    progress: bool = False,
    workers: int | None = None,
    preferred: np.ndarray | None = None,
) -> np.ndarray:
    """`vocab_map` on canonical strings (index = token id); ``workers`` default: the usable CPUs.

    ``preferred`` (`preferred_ids` of the target tokenizer) picks the id among target ids sharing a
    string; without it, the smallest. The cache holds the map before that choice."""
    if preferred is not None and len(preferred) != len(target_strings):
        raise ValueError(
            f"preferred ids for {len(preferred)} target tokens, but there are {len(target_strings)}"
        )
    path = cache_path(source_strings, target_strings, cache_dir)
    vmap = _read_cache(path, len(source_strings), len(target_strings))
    if vmap is None:
        vmap = nearest_targets(
            source_strings, target_strings, workers=workers or usable_cpus(), progress=progress
        )
        _write_cache(path, vmap)
    return vmap if preferred is None else np.asarray(preferred, dtype=np.int64)[vmap]


@dataclass(frozen=True)
class VocabMapStats:
    """How close the map's matches are: exact (distance 0), near (1-2), far (3+), a histogram."""

    num_source: int
    num_target: int
    exact: int
    near: int
    far: int
    histogram: dict[int, int]
    seconds: float

    @classmethod
    def of(
        cls, source_strings: Sequence[str], target_strings: Sequence[str], vmap: np.ndarray, seconds: float
    ) -> VocabMapStats:
        distances = np.asarray(
            process.cpdist(
                list(source_strings), [target_strings[j] for j in vmap.tolist()], scorer=Levenshtein.distance
            )
        )
        values, counts = np.unique(distances, return_counts=True)
        return cls(
            num_source=len(source_strings),
            num_target=len(target_strings),
            exact=int((distances == 0).sum()),
            near=int(((distances >= 1) & (distances <= 2)).sum()),
            far=int((distances >= 3).sum()),
            histogram={int(v): int(c) for v, c in zip(values, counts, strict=True)},
            seconds=seconds,
        )
