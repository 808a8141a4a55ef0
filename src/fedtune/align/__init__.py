"""Token alignment between tokenizers (FedMKT, Fan et al. 2024, App. B): canonical token strings, the
minimum-edit-distance vocabulary map, the DTW alignment of two tokenizations and the projection of
a sender's top-k logits onto the receiver's tokens."""

from fedtune.align.sequence import (
    agreeing_matches,
    align_sequences,
    brute_force_align_sequences,
    one_to_one,
    project_topk,
)
from fedtune.align.tokens import (
    display_token,
    normalize_token,
    token_strings,
    tokenizer_family,
    vocabulary_strings,
)
from fedtune.align.vocab import (
    VocabMapStats,
    brute_force_vocab_map,
    preferred_ids,
    vocab_map,
    vocab_map_of_strings,
)

__all__ = [
    "VocabMapStats",
    "agreeing_matches",
    "align_sequences",
    "brute_force_align_sequences",
    "brute_force_vocab_map",
    "display_token",
    "normalize_token",
    "one_to_one",
    "preferred_ids",
    "project_topk",
    "token_strings",
    "tokenizer_family",
    "vocab_map",
    "vocab_map_of_strings",
    "vocabulary_strings",
]
