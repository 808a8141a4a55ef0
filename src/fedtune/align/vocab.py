"""The MinED vocabulary map of FedMKT (paper 001, App. B (a)): every source token -> the target token
of minimum edit distance, computed once per tokenizer pair and cached on disk.

Rule (on the canonical strings of `fedtune.align.tokens`): minimum Levenshtein distance; ties ->
the lexicographically smallest target string (Python ``str`` order), then the smallest id. An exact
match is the distance-0 case of the same rule, so a string present in the target maps to itself
(to its smallest id if several target ids share it).

Deviations from FATE-LLM's ``get_vocab_mappings`` (itself FuseLLM's): FATE-LLM breaks ties by the
order of ``tokenizer.get_vocab()`` (a dict's order, not specified); it maps token strings, so added
tokens are looked up by their text and ids sharing one string collapse; here the map is over ids.

Speed: `brute_force_vocab_map` is what FATE-LLM does (for each source token, a Python loop of an
edit distance call over the whole target vocabulary). `vocab_map` gives the same answer by
(1) exact matches through a dict; (2) for the rest, in blocks of sources of one length L with the
same number u of characters that occur in no target string, targets bucketed by length Lt and
searched in increasing lower bound ``max(L, Lt) - min(L - u, Lt)`` (at most that many characters
can be kept), each bucket in one C call (``rapidfuzz.process.cdist``, cut off at the block's worst
best distance), a source leaving the search once the bound exceeds its best distance (a bucket at
exactly that bound is still searched: it may hold a tie that sorts first). A source with u = L
shares no character with any target: its distance to a bucket is the bound itself, no call needed.
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

from fedtune.align.tokens import vocabulary_strings

FORMAT_VERSION = 1
"""Bump when the rule or the file layout changes: old cache files are then simply not found."""
_SOURCE_BLOCK = 256


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_align_cache_dir() -> Path:
    from fedtune.models.zoo import default_cache_dir

    return default_cache_dir() / "align"


def _tie_order(target_strings: Sequence[str]) -> list[int]:
    """Target ids in tie-rule order: by string, equal strings by id (the sort is stable)."""
    return sorted(range(len(target_strings)), key=target_strings.__getitem__)


def _ranks(order: list[int]) -> np.ndarray:
    """The position of every target id in tie-rule order: the tie rule as one integer."""
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


def _exact_matches(target_strings: Sequence[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for index, text in enumerate(target_strings):
        first.setdefault(text, index)
    return first


@dataclass(frozen=True)
class _Bucket:
    """The targets of one string length, in tie-rule order."""

    ids: np.ndarray
    strings: list[str]


def _length_buckets(target_strings: Sequence[str], order: list[int]) -> dict[int, _Bucket]:
    ordered = np.asarray(order, dtype=np.int64)
    lengths = np.fromiter(map(len, target_strings), dtype=np.int64, count=len(target_strings))[ordered]
    by_length = np.argsort(lengths, kind="stable")  # stays in tie-rule order within a length
    sizes, starts = np.unique(lengths[by_length], return_index=True)
    buckets = {}
    for size, ids in zip(sizes.tolist(), np.split(ordered[by_length], starts[1:]), strict=True):
        buckets[size] = _Bucket(ids, [target_strings[i] for i in ids.tolist()])
    return buckets


def _distance_bound(length: int, aliens: int, target_length: int) -> int:
    """A lower bound on the edit distance from a string of ``length`` characters, ``aliens`` of which
    occur in no target string, to any target of ``target_length``: at most ``min(length - aliens,
    target_length)`` characters can be kept, every other character of the longer side costs one edit."""
    return max(length, target_length) - min(length - aliens, target_length)


def _search_block(
    sources: list[str],
    length: int,
    aliens: int,
    buckets: dict[int, _Bucket],
    ranks: np.ndarray,
    workers: int,
) -> np.ndarray:
    """Nearest targets of ``sources`` (each of ``length`` characters, ``aliens`` of them in no target),
    by the tie rule: buckets in increasing lower bound, until the bound passes every best distance."""
    unset = np.iinfo(np.int64).max
    best_distance = np.full(len(sources), unset, dtype=np.int64)
    best_rank = np.full(len(sources), unset, dtype=np.int64)
    best_id = np.full(len(sources), -1, dtype=np.int64)
    plan = sorted((_distance_bound(length, aliens, size), size) for size in buckets)
    for bound, size in plan:
        active = np.flatnonzero(best_distance >= bound)
        if active.size == 0:
            break
        bucket = buckets[size]
        if aliens == length:
            # Nothing in common with any target: the distance is the bound itself for the whole
            # bucket, and its first string wins the tie.
            column = np.zeros(active.size, dtype=np.int64)
            found = np.full(active.size, bound, dtype=np.int64)
        else:
            cutoff = int(best_distance[active].max())
            distances = process.cdist(
                [sources[i] for i in active],
                bucket.strings,
                scorer=Levenshtein.distance,
                dtype=np.int32,
                workers=workers,
                score_cutoff=None if cutoff == unset else cutoff,
            )
            # The bucket is in tie-rule order: argmin's first minimum is the winner of its ties.
            column = distances.argmin(axis=1)
            found = distances[np.arange(active.size), column].astype(np.int64)
        found_rank = ranks[bucket.ids[column]]
        better = (found < best_distance[active]) | (
            (found == best_distance[active]) & (found_rank < best_rank[active])
        )
        winners = active[better]
        best_distance[winners] = found[better]
        best_rank[winners] = found_rank[better]
        best_id[winners] = bucket.ids[column[better]]
    return best_id


def nearest_targets(
    source_strings: Sequence[str], target_strings: Sequence[str], *, workers: int = 1, progress: bool = False
) -> np.ndarray:
    """For each source string, the target id of minimum edit distance by the module's tie rule [S]."""
    if not target_strings:
        raise ValueError("the target vocabulary is empty")
    result = np.full(len(source_strings), -1, dtype=np.int64)
    exact = _exact_matches(target_strings)
    alphabet = set("".join(target_strings))
    groups: dict[tuple[int, int], list[int]] = {}
    for index, text in enumerate(source_strings):
        if text in exact:
            result[index] = exact[text]
        else:
            aliens = sum(char not in alphabet for char in text)
            groups.setdefault((len(text), aliens), []).append(index)
    order = _tie_order(target_strings)
    ranks = _ranks(order)
    buckets = _length_buckets(target_strings, order)
    blocks = [
        (key, indices[start : start + _SOURCE_BLOCK])
        for key, indices in sorted(groups.items())
        for start in range(0, len(indices), _SOURCE_BLOCK)
    ]
    started = time.perf_counter()
    for done, ((length, aliens), indices) in enumerate(blocks, 1):
        sources = [source_strings[i] for i in indices]
        result[indices] = _search_block(sources, length, aliens, buckets, ranks, workers)
        if progress and (done % 50 == 0 or done == len(blocks)):
            seconds = time.perf_counter() - started
            print(
                f"vocab map: {done}/{len(blocks)} blocks of inexact tokens, {seconds:.0f} s", file=sys.stderr
            )
    return result


def brute_force_vocab_map(
    source_strings: Sequence[str], target_strings: Sequence[str], source_ids: Sequence[int]
) -> np.ndarray:
    """The reference: for each of ``source_ids``, one edit distance call per target string, then the
    tie rule over all of them (FATE-LLM's loop, plus the tie rule). int64 [len(source_ids)]."""
    mapped = []
    for source_id in source_ids:
        text = source_strings[source_id]
        distances = [Levenshtein.distance(text, target) for target in target_strings]
        best = min(distances)
        mapped.append(
            min((target_strings[j], j) for j, distance in enumerate(distances) if distance == best)[1]
        )
    return np.asarray(mapped, dtype=np.int64)


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
    return vocab_map_of_strings(source_strings, target_strings, cache_dir=cache_dir, progress=progress)


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
) -> np.ndarray:
    """`vocab_map` on canonical strings (index = token id); ``workers`` default: the usable CPUs."""
    path = cache_path(source_strings, target_strings, cache_dir)
    cached = _read_cache(path, len(source_strings), len(target_strings))
    if cached is not None:
        return cached
    vmap = nearest_targets(
        source_strings, target_strings, workers=workers or usable_cpus(), progress=progress
    )
    _write_cache(path, vmap)
    return vmap


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
