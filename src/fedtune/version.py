"""The package version (its own module, so any layer may read it without importing the package API)."""

__version__ = "0.1.0"
