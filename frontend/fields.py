"""Field types the request models share: what JSON can carry but the rest of the stack cannot."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _valid_unicode(value: str) -> str:
    # JSON may escape a lone UTF-16 surrogate ("\ud800") and Python keeps it in the str, but no UTF-8 encoder can
    # write it (msgspec towards the backend, a JSON answer that echoes it): a 400 here, not a 500 later.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains a lone UTF-16 surrogate at position {e.start}; text must be valid Unicode") \
            from None
    return value


# Every free-text field of a request body.
Text = Annotated[str, AfterValidator(_valid_unicode)]
