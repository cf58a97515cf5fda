"""backend/errors.py's fatal_reason: the dead sentinel names an engine failure, even one raised without a message."""

from __future__ import annotations

from backend.errors import fatal_reason


def _raised(e: Exception) -> Exception:
    try:
        raise e
    except Exception as caught:
        return caught


def test_a_failure_with_a_message_is_named_by_it():
    assert fatal_reason(_raised(RuntimeError("boom"))) == "engine failed: boom"


def test_a_bare_assertion_is_named_by_its_type_and_where_it_was_raised():
    def select_experts(scoring_func: str) -> None:
        if scoring_func != "softmax":  # a bare `assert`, as vLLM's (pytest rewrites those of test files)
            raise AssertionError

    try:
        select_experts("sigmoid")
    except AssertionError as e:
        reason = fatal_reason(e)
    line = select_experts.__code__.co_firstlineno + 2
    assert reason == f"engine failed: AssertionError at {__file__}:{line}"
    assert fatal_reason(AssertionError()) == "engine failed: AssertionError"  # never raised: no traceback
