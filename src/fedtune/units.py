"""Units, one convention for the whole project: traffic in MB = 10^6 bytes, memory in MiB = 2^20 bytes.

Metric keys keep their historical ``_mb`` suffix for memory (``peak_rss_mb`` holds MiB); every
display labels the unit it shows.
"""

from __future__ import annotations

BYTES_PER_MB = 1e6
BYTES_PER_MIB = 2**20


def megabytes(num_bytes: float) -> str:
    """``num_bytes`` as decimal megabytes, labelled: ``"1.23 MB"``."""
    return f"{num_bytes / BYTES_PER_MB:.2f} MB"
