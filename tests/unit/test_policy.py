"""Unit tests for backend.policy: `choose` as a decision table (add a row per new snapshot field or work kind)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from backend import policy
from backend.policy import EngineStep, Idle, PocBatch, Snapshot

# (snapshot, expected work, why): one row per case the loop must get right.
DECISIONS = [
    (Snapshot(has_engine_work=True), EngineStep(), "vLLM has unfinished requests: step the engine"),
    (Snapshot(has_engine_work=False), Idle(), "nothing to run: block on the inbox"),
    (Snapshot(has_engine_work=False, has_poc_work=True), PocBatch(), "only PoC queued: run it back to back"),
    (Snapshot(has_engine_work=False, has_poc_work=True, num_poc_since_step=9), PocBatch(),
     "no chat to share with: the PoC share does not apply"),
    (Snapshot(has_engine_work=True, has_poc_work=True, num_poc_since_step=0), PocBatch(),
     "both compete: PoC gets its share first"),
    (Snapshot(has_engine_work=True, has_poc_work=True, num_poc_since_step=1), EngineStep(),
     "both compete, PoC share used up: chat steps"),
    (Snapshot(has_engine_work=True, has_poc_work=True, num_poc_since_step=2, poc_batches_per_step=3),
     PocBatch(), "a larger PoC share runs more batches per engine step"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_poc_blocked=True), EngineStep(),
     "PoC found no free KV blocks: an engine step frees some first"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_poc_blocked=True), PocBatch(),
     "blocked but nothing else runs: retry the PoC (blocks free up only from it)"),
]


@pytest.mark.parametrize("snapshot,expected,why", DECISIONS, ids=[row[2] for row in DECISIONS])
def test_policy_choose_follows_decision_table(snapshot, expected, why):
    assert policy.choose(snapshot) == expected, why


def test_policy_table_covers_every_work_kind():
    assert {type(expected) for _, expected, _ in DECISIONS} == set(typing.get_args(policy.Work))


def test_policy_snapshot_and_work_are_frozen():
    for value in (Snapshot(has_engine_work=True), EngineStep(), Idle()):
        assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen


def test_policy_choose_is_pure():
    for snapshot, _, _ in DECISIONS:
        assert policy.choose(snapshot) == policy.choose(snapshot)
