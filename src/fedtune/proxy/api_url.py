"""Whether a model name is an HTTP API's URL, and that URL checked: without the HTTP client (or torch),
so that validating a config stays light."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_api_url(value: str) -> bool:
    """Whether ``value`` names an HTTP API rather than a model (``fedpt.large_model``)."""
    return "://" in value


def check_api_url(value: str) -> str:
    """``value`` as an API base URL (``http(s)://host[:port][/path]``, no query), without a trailing slash;
    a ``ValueError`` saying what is wrong (without repeating ``value``) otherwise."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError("an API URL starts with http:// or https://")
    if not parts.hostname:
        raise ValueError("the URL names no host; e.g. http://127.0.0.1:8000/v1")
    try:
        parts.port  # noqa: B018 (parsing the port raises for a bad one)
    except ValueError:
        raise ValueError("the URL has a bad port") from None
    if parts.query or parts.fragment:
        raise ValueError("an API URL takes no query or fragment")
    return value.rstrip("/")
