"""Field types the request models share: what JSON can carry but the rest of the stack cannot."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field


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


def _integral(value: object) -> object:
    # JSON has one number type: JSON Schema calls 1.0 an integer, and so do JSON clients that write every number
    # as a double. A float with no fraction part is that integer; any other float stays and is refused by the
    # strict int check after this one ("Input should be a valid integer", naming the field). Strings and booleans
    # are never integers here.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Every integer field of a request body has one of these types, so that each takes 1.0 as 1. The bounds come
# first: a validator before them would make pydantic write them into the schema under their Python names.
# msgspec encodes integers up to 64 bits: a bigger one must be a 400 here, not a 500 when the request is encoded
# for the backend.
INT64_MAX = 2**63 - 1
INTEGRAL = BeforeValidator(_integral)
Int64 = Annotated[int, Field(ge=-(2**63), lt=2**63), INTEGRAL]
Count = Annotated[int, Field(ge=1, le=INT64_MAX), INTEGRAL]  # at least one
Index = Annotated[int, Field(ge=0, le=INT64_MAX), INTEGRAL]  # ids, offsets, counts that may be zero
TopK = Annotated[int, Field(ge=-1, le=INT64_MAX), INTEGRAL]  # vLLM's top_k: -1 (or 0) means all tokens
TopLogprobs = Annotated[int, Field(ge=0, le=20), INTEGRAL]  # OpenAI's bound
