"""Grammar graceful degradation: an enforced token the grammar rejects disables the grammar for that
request from that position on, instead of failing the request (engine-side, wraps vLLM's grammar objects).

While disabled the grammar writes an all-allowed bitmask row, so no stale mask from an earlier step can
constrain later positions (the fork's V1 patch left the row unwritten).
"""

from __future__ import annotations

import structlog
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

from sampling.enforced import ENFORCED_KEY

log = structlog.get_logger(__name__)


class TolerantGrammar(StructuredOutputGrammar):
    def __init__(self, inner: StructuredOutputGrammar, request_id: str) -> None:
        self.inner = inner
        self.request_id = request_id
        self.is_disabled = False

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if self.is_disabled:
            return True
        for i, token in enumerate(tokens):
            if self.inner.is_terminated():
                return False  # a finished grammar still ends the request, as before
            if not self.inner.accept_tokens(request_id, [token]):
                self.is_disabled = True
                log.warning("grammar_disabled_by_enforced_token", rid=request_id, token_id=token, offset=i)
                return True
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return list(tokens) if self.is_disabled else self.inner.validate_tokens(tokens)

    def rollback(self, num_tokens: int) -> None:
        if not self.is_disabled:
            self.inner.rollback(num_tokens)

    def fill_bitmask(self, bitmask, batch_index: int) -> None:
        if self.is_disabled:
            bitmask[batch_index].fill_(-1)  # every token allowed
        else:
            self.inner.fill_bitmask(bitmask, batch_index)

    def is_terminated(self) -> bool:
        return False if self.is_disabled else self.inner.is_terminated()

    def reset(self) -> None:
        self.is_disabled = False
        self.inner.reset()


def install(manager) -> None:
    """Wraps the grammars that `manager` (vLLM's StructuredOutputManager) creates for enforced requests."""
    if getattr(manager, "_pocserve_tolerant", False):
        return
    create = manager._create_grammar

    def create_tolerant(request):
        grammar = create(request)
        extra = request.sampling_params.extra_args or {}
        return TolerantGrammar(grammar, request.request_id) if extra.get(ENFORCED_KEY) else grammar

    manager._create_grammar = create_tolerant
    manager._pocserve_tolerant = True
