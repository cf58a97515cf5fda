"""Unit tests for sampling/grammar.py: a grammar that an enforced token breaks turns itself off for that request
instead of failing it, and only replay requests get the tolerant wrapper (stand-in grammars; no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sampling import grammar
from sampling.enforced import ENFORCED_KEY
from sampling.grammar import TolerantGrammar


class Grammar:
    """A StructuredOutputGrammar stand-in: accepts the tokens in `allowed`, terminates after `length` tokens."""

    def __init__(self, allowed: set[int], length: int = 100) -> None:
        self.allowed = allowed
        self.length = length
        self.accepted: list[int] = []
        self.rolled_back = 0
        self.resets = 0

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if not set(tokens) <= self.allowed:
            return False
        self.accepted += tokens
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return [t for t in tokens if t in self.allowed]

    def rollback(self, num_tokens: int) -> None:
        self.rolled_back += num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        bitmask[batch_index] = 0b101

    def is_terminated(self) -> bool:
        return len(self.accepted) >= self.length

    def reset(self) -> None:
        self.resets += 1
        self.accepted = []


def _bitmask() -> torch.Tensor:
    return torch.zeros(2, 4, dtype=torch.int32)


def test_an_accepting_grammar_works_as_the_inner_one():
    inner = Grammar({1, 2})
    g = TolerantGrammar(inner, "r1")
    assert g.accept_tokens("r1", [1, 2]) and inner.accepted == [1, 2] and not g.is_disabled
    assert g.validate_tokens([1, 3, 2]) == [1, 2]
    g.rollback(1)
    assert inner.rolled_back == 1
    bitmask = _bitmask()
    g.fill_bitmask(bitmask, 1)
    assert bitmask[1].tolist() == [0b101] * 4 and bitmask[0].tolist() == [0] * 4


def test_a_rejected_token_turns_the_grammar_off_instead_of_failing():
    inner = Grammar({1, 2})
    g = TolerantGrammar(inner, "r1")
    assert g.accept_tokens("r1", [1, 3, 2]) is True
    assert g.is_disabled and inner.accepted == [1]  # the tokens after the rejected one never reach it
    assert g.accept_tokens("r1", [9]) is True and inner.accepted == [1]
    assert g.validate_tokens([7, 8]) == [7, 8]
    g.rollback(2)
    assert inner.rolled_back == 0
    assert g.is_terminated() is False


def test_a_turned_off_grammar_allows_every_token_in_its_bitmask_row():
    g = TolerantGrammar(Grammar(set()), "r1")
    g.accept_tokens("r1", [5])
    bitmask = _bitmask()
    bitmask[1] = 0b11  # a stale row from an earlier step
    g.fill_bitmask(bitmask, 1)
    assert bitmask[1].tolist() == [-1] * 4 and bitmask[0].tolist() == [0] * 4


def test_a_finished_grammar_still_ends_the_request():
    inner = Grammar({1}, length=1)
    g = TolerantGrammar(inner, "r1")
    assert g.accept_tokens("r1", [1, 1]) is False and inner.accepted == [1] and not g.is_disabled
    assert g.is_terminated()


def test_reset_turns_the_grammar_back_on():
    inner = Grammar({1})
    g = TolerantGrammar(inner, "r1")
    g.accept_tokens("r1", [2])
    g.reset()
    assert not g.is_disabled and inner.resets == 1
    assert g.accept_tokens("r1", [1]) and inner.accepted == [1]


# --- install ---

class Manager:
    """vLLM's StructuredOutputManager as install sees it: _create_grammar(request) -> grammar."""

    def _create_grammar(self, request) -> Grammar:
        return Grammar({1})


def _request(extra_args: dict | None) -> SimpleNamespace:
    return SimpleNamespace(request_id="r1", sampling_params=SimpleNamespace(extra_args=extra_args))


def test_install_wraps_only_replay_requests_grammars_once():
    manager = Manager()
    grammar.install(manager)
    create = manager._create_grammar
    grammar.install(manager)
    assert manager._create_grammar is create  # a second install changes nothing
    tolerant = manager._create_grammar(_request({ENFORCED_KEY: [1, 2]}))
    assert isinstance(tolerant, TolerantGrammar) and tolerant.request_id == "r1"
    assert isinstance(tolerant.inner, Grammar)
    assert type(manager._create_grammar(_request(None))) is Grammar
    assert type(manager._create_grammar(_request({"logprobs_mode": "raw_logprobs"}))) is Grammar
