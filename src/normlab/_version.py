"""The version of normlab (the package and the records it writes carry it)."""

__version__ = "0.1.0"
