"""Errors that end a run with a message for the user (no traceback): what went wrong, what to change."""

from __future__ import annotations


class RunError(RuntimeError):
    """A run cannot go on; the message names the cause and the file or config key to look at."""
