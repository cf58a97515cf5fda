"""Typed input errors raised by the PoC math before any tensor work starts."""

from __future__ import annotations


class PocInputError(ValueError):
    """A PoC input is out of its valid range; `field` names the offending request field.

    Subclasses ValueError because the reference fork raised plain ValueError for these cases
    (for example k_dim > hidden size), and callers that map ValueError to 400 keep working.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
