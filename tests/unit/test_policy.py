"""Unit tests for backend.core.policy and backend.core.share: `choose` as a decision table (add a row per new
snapshot field or work kind), and the chat share's account driven through chat idle, light chat, heavy chat, share 0
and 1."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from backend.core import policy
from backend.core.policy import EngineStep, Idle, PocBatch, PocChunk, PocCollect, PocLaunch, Snapshot
from backend.core.share import INFINITE, ChatShare
from backend.pow.cost import Cost

# A forward: 2 ms of overhead, 1 ms a sequence; efficient from 8 sequences (overhead at most a fifth).
COST = Cost(overhead_s=0.002, per_seq_s=0.001)
# The CPU engine's tiny model at seq_len 1024: 127 ms a sequence (docs/benchmarks-history.md).
CPU_COST = Cost(overhead_s=0.001, per_seq_s=0.127)
# A forward whose 5% floor is 3 sequences and whose 20% floor is 1 (10 ms overhead, 84 ms a sequence).
CPU_BURSTY = Cost(overhead_s=0.01, per_seq_s=0.084)

# The 235B model at TP=2 in shared mode (docs/benchmarks-history.md): only one-sequence forwards seen, 145 ms each.
FULL_DEPTH_ONE_SIZE = Cost(overhead_s=0.0, per_seq_s=0.145, only_size=1)

# (snapshot, expected work, why): one row per case the loop must get right.
DECISIONS = [
    (Snapshot(has_engine_work=True), EngineStep(), "vLLM has unfinished requests: step the engine"),
    (Snapshot(has_engine_work=False), Idle(), "nothing to run: block on the inbox"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=True), PocBatch(),
     "chat gated (exclusive round): PoC runs whole forwards"),
    (Snapshot(has_engine_work=False, has_poc_work=True), PocBatch(limit=1),
     "chat idle, cost not learned yet: one sequence first, a request may arrive meanwhile"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=COST, poc_max_batch=32), PocBatch(),
     "chat idle: a whole forward fits the idle bound"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=Cost(0.001, 0.2), poc_max_batch=32),
     PocBatch(limit=1), "chat idle, slow forwards (the CPU engine at seq_len 1024): split to bound a new chat's wait"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=Cost(0.02, 0.05), poc_max_batch=32),
     PocBatch(limit=8), "chat idle: split, but no smaller than 5% overhead allows"),
    (Snapshot(has_engine_work=False, is_chat_quiet=False, has_poc_work=True, poc_cost=Cost(0.02, 0.05),
              poc_max_batch=32), PocBatch(limit=4),
     "chat idle but ran within CHAT_QUIET_S: the idle bound holds at up to 20% overhead (the next burst is likely)"),
    (Snapshot(has_engine_work=False, is_chat_preparing=True), Idle(),
     "a request is being tokenized and nothing else runs: wait for it"),
    (Snapshot(has_engine_work=False, is_chat_preparing=True, has_poc_work=True, poc_credit_s=0.0), Idle(),
     "a request is being tokenized: no credit, so PoC does not start a forward it would wait behind"),
    (Snapshot(has_engine_work=False, is_chat_preparing=True, has_poc_work=True, poc_credit_s=0.05, poc_cost=COST,
              poc_max_batch=32), PocBatch(limit=48), "a request is being tokenized: PoC spends its credit only"),
    (Snapshot(has_engine_work=False, is_chat_recent=True, has_poc_work=True, poc_credit_s=0.0, poc_cost=COST,
              poc_max_batch=32), Idle(),
     "chat went quiet a moment ago (its linger): no idle forward that the client's next request would wait behind"),
    (Snapshot(has_engine_work=False, is_chat_recent=True, has_poc_work=True, poc_credit_s=0.05, poc_cost=COST,
              poc_max_batch=32), PocBatch(limit=48), "chat's linger: PoC spends the credit it has left, no more"),
    (Snapshot(has_engine_work=False, is_chat_recent=True, is_chat_gated=True, has_poc_work=True, poc_cost=COST,
              poc_max_batch=32), PocBatch(), "chat gated (exclusive round): no request can come, the linger is moot"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_credit_s=-3.0, poc_cost=COST, poc_max_batch=32),
     PocBatch(), "no chat to share with: the account does not apply"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.0), EngineStep(),
     "both compete, no credit: chat steps"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.05, poc_max_batch=32), PocBatch(limit=1),
     "both compete, cost not learned yet: one sequence starts the model"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.05, poc_cost=COST, poc_max_batch=32),
     PocBatch(limit=48), "both compete: the forward takes what the credit buys (the queue caps it)"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.006, poc_cost=COST, poc_max_batch=32),
     EngineStep(), "credit buys only a forward that is mostly overhead: chat steps, PoC keeps earning"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.006, poc_cost=COST, poc_max_batch=3),
     PocBatch(limit=4), "the task has fewer sequences left than an efficient forward: they run when affordable"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=INFINITE, poc_cost=COST, poc_max_batch=32),
     PocBatch(), "share 0: PoC runs whole forwards even while chat waits"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_poc_blocked=True, poc_credit_s=1.0), EngineStep(),
     "PoC found no free KV blocks: an engine step frees some first"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_poc_blocked=True, is_chat_gated=True), PocBatch(),
     "blocked but nothing else runs: retry the PoC (blocks free up only from it)"),
    # --- a cost learned from one forward size only: probe another (full depth: 145 ms one sequence, 50 ms each whole)
    (Snapshot(has_engine_work=False, is_chat_quiet=False, has_poc_work=True, poc_cost=FULL_DEPTH_ONE_SIZE,
              poc_max_batch=32), PocBatch(limit=2),
     "chat idle, only one-sequence forwards seen: twice that, so that overhead can be told from per-sequence time"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=Cost(0.0, 0.005, only_size=32), poc_max_batch=32),
     PocBatch(limit=16), "chat idle, only whole forwards seen: half of one probes"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.2, poc_cost=FULL_DEPTH_ONE_SIZE,
              poc_max_batch=32), EngineStep(), "beside chat, one size seen: PoC earns for the probe, not another one"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.3, poc_cost=FULL_DEPTH_ONE_SIZE,
              poc_max_batch=32), PocBatch(limit=2), "beside chat, one size seen: the probe once affordable"),
    (Snapshot(has_engine_work=True, has_poc_work=True, poc_credit_s=0.3, poc_cost=FULL_DEPTH_ONE_SIZE,
              poc_max_batch=1), PocBatch(limit=2), "one sequence left in the task: no probe, one forward"),
    # --- a forward parked between decoder layers (time-sliced, one rank: PocRunner.parks)
    (Snapshot(has_engine_work=False, has_poc_work=True, can_park_poc=True, poc_num_layers=4),
     PocBatch(limit=1, parked=True), "chat idle, engine parks forwards, cost not learned: one sequence, parked"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=CPU_COST, poc_max_batch=32, can_park_poc=True,
              poc_num_layers=4), PocBatch(limit=1, parked=True),
     "chat idle, parked: sized so that one layer chunk stays within PARKED_WAIT_S (CPU engine, 4 layers)"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=COST, poc_max_batch=32, can_park_poc=True,
              poc_num_layers=28), PocBatch(parked=True), "chat idle, parked: a whole fast forward fits"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=CPU_BURSTY, poc_max_batch=32, can_park_poc=True,
              poc_num_layers=4), PocBatch(limit=3, parked=True),
     "mining alone (chat quiet for CHAT_QUIET_S), parked: no smaller than 5% overhead, though a chunk outlasts "
     "PARKED_WAIT_S"),
    (Snapshot(has_engine_work=False, is_chat_quiet=False, has_poc_work=True, poc_cost=CPU_BURSTY, poc_max_batch=32,
              can_park_poc=True, poc_num_layers=4), PocBatch(limit=1, parked=True),
     "chat ran lately, parked: one layer chunk within PARKED_WAIT_S at up to 20% overhead (CPU bursts)"),
    (Snapshot(has_engine_work=False, has_poc_work=True, poc_cost=COST, poc_max_batch=32, can_park_poc=True,
              is_chat_gated=True), PocBatch(), "chat gated: whole forwards, never parked (no request can come)"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_poc_in_flight=True, can_park_poc=True), PocChunk(),
     "a parked forward, chat idle: its next chunk"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, can_park_poc=True, poc_credit_s=0.0),
     EngineStep(), "a request arrived while a forward was parked: chat's step goes first, the forward waits"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, can_park_poc=True, poc_credit_s=0.01),
     PocChunk(), "a parked forward beside running chat: a chunk whenever chat's share leaves PoC credit"),
    (Snapshot(has_engine_work=False, is_chat_preparing=True, has_poc_work=True, is_poc_in_flight=True,
              can_park_poc=True, poc_credit_s=0.0), Idle(),
     "a parked forward while a request is tokenized, no credit: wait for the request, not a chunk"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, can_park_poc=True, is_chat_gated=True),
     PocChunk(), "a parked forward when a round gates chat: chunks back to back"),
    # --- an exclusive round's forwards launched back to back (time-sliced, one pipeline stage: PocRunner.pipelines)
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=True, can_pipeline_poc=True,
              can_park_poc=True), PocLaunch(), "chat gated, engine pipelines: a whole forward launched, not parked"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=True, can_pipeline_poc=True,
              is_poc_in_flight=True, is_poc_pipelined=True, has_poc_slot=True), PocLaunch(),
     "chat gated, one forward in flight and a slot free: the next queued behind it"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=True, can_pipeline_poc=True,
              is_poc_in_flight=True, is_poc_pipelined=True, has_poc_slot=False), PocCollect(),
     "chat gated, no slot (two in flight, or no nonces left to launch): the oldest collected"),
    (Snapshot(has_engine_work=True, has_poc_work=True, is_chat_gated=False, can_pipeline_poc=True,
              is_poc_in_flight=True, is_poc_pipelined=True, has_poc_slot=True, poc_credit_s=1.0), PocCollect(),
     "the round ended with forwards in flight: they are collected before chat's step (it would queue behind them)"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=True, can_pipeline_poc=True,
              is_chat_preparing=True, is_poc_in_flight=True, is_poc_pipelined=True, has_poc_slot=True), PocCollect(),
     "a request being prepared while gated (in flight when the round began): no more launched, the oldest collected"),
    (Snapshot(has_engine_work=False, has_poc_work=True, is_chat_gated=False, can_pipeline_poc=True,
              poc_cost=CPU_COST, poc_max_batch=32, can_park_poc=True, poc_num_layers=4), PocBatch(limit=1, parked=True),
     "chat idle, not gated: pipelining is for exclusive rounds only; the idle forward as before"),
]


@pytest.mark.parametrize("snapshot,expected,why", DECISIONS, ids=[row[2] for row in DECISIONS])
def test_policy_choose_follows_decision_table(snapshot, expected, why):
    assert policy.choose(snapshot) == expected, why


def test_policy_table_covers_every_work_kind():
    assert {type(expected) for _, expected, _ in DECISIONS} == set(typing.get_args(policy.Work))


def test_policy_snapshot_and_work_are_frozen():
    for value in (Snapshot(has_engine_work=True), EngineStep(), Idle(), PocBatch()):
        assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen


def test_policy_choose_is_pure():
    for snapshot, _, _ in DECISIONS:
        assert policy.choose(snapshot) == policy.choose(snapshot)


# --- the share's account, driven like the loop drives it ---

STEP_S = 0.010  # an engine step
MAX_BATCH = 32


def simulate(share: float, *, chat_busy: bool, poc_busy: bool, seconds: float = 10.0) -> tuple[float, float]:
    """Runs policy + account with fixed step and forward costs; returns (chat, PoC) fractions of the time."""
    account, chat_s, poc_s, now = ChatShare(share), 0.0, 0.0, 0.0
    while now < seconds:
        work = policy.choose(Snapshot(has_engine_work=chat_busy, has_poc_work=poc_busy,
                                      poc_credit_s=account.credit_s, poc_cost=COST, poc_max_batch=MAX_BATCH))
        if isinstance(work, EngineStep):
            account.after_step(STEP_S, is_poc_waiting=poc_busy, min_forward_s=COST.seconds(COST.efficient_size()))
            chat_s, now = chat_s + STEP_S, now + STEP_S
        elif isinstance(work, PocBatch):
            elapsed = COST.seconds(MAX_BATCH if work.limit is None else min(MAX_BATCH, work.limit))
            account.after_poc(elapsed, is_chat_waiting=chat_busy)
            poc_s, now = poc_s + elapsed, now + elapsed
        else:
            now += STEP_S
    return chat_s / now, poc_s / now


@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_share_heavy_chat_gets_its_share(share):
    chat, poc = simulate(share, chat_busy=True, poc_busy=True)
    assert chat == pytest.approx(share, abs=0.02) and chat + poc == pytest.approx(1.0)


def test_share_chat_idle_gives_poc_the_whole_device():
    assert simulate(0.5, chat_busy=False, poc_busy=True) == (0.0, 1.0)


def test_share_no_poc_gives_chat_the_whole_device():
    assert simulate(0.5, chat_busy=True, poc_busy=False) == (1.0, 0.0)


def test_share_1_runs_poc_only_when_chat_is_idle():
    assert simulate(1.0, chat_busy=True, poc_busy=True) == (1.0, 0.0)


def test_share_0_runs_chat_only_when_poc_is_idle():
    assert simulate(0.0, chat_busy=True, poc_busy=True) == (0.0, 1.0)


def test_share_light_chat_leaves_poc_the_rest():
    """Chat that comes and goes: while it is idle PoC banks nothing, and PoC still runs between its steps."""
    account = ChatShare(0.5)
    account.after_step(STEP_S, is_poc_waiting=True)
    assert account.credit_s == pytest.approx(STEP_S)
    account.after_poc(0.5, is_chat_waiting=False)  # chat went idle: PoC ran freely, nothing owed either way
    assert account.credit_s == 0.0
    account.after_step(STEP_S, is_poc_waiting=True)
    assert account.credit_s == pytest.approx(STEP_S)


def test_share_credit_cap_rises_to_an_efficient_forward():
    account = ChatShare(0.5)
    for _ in range(10):
        account.after_step(STEP_S, is_poc_waiting=True, min_forward_s=0.05)
    assert account.credit_s == pytest.approx(0.1)  # up to two efficient forwards' worth, banked over ten steps


def test_cost_model_separates_overhead_from_per_sequence_time():
    from backend.pow.cost import CostModel
    model = CostModel()
    model.observe(128, 1, 0.0075)
    assert model.cost(128) == Cost(0.0, 0.0075, only_size=1)  # one size only: all of it counts per sequence
    model.observe(128, 16, 0.0600)
    cost = model.cost(128)
    assert cost is not None and cost.overhead_s == pytest.approx(0.0040) and cost.per_seq_s == pytest.approx(0.0035)
    assert cost.efficient_size() == 5 and cost.sequences_within(0.02) == 4 and model.cost(64) is None
    assert cost.only_size == 0
    for _ in range(40):  # the window forgets the other size: the fit it gave stays
        model.observe(128, 8, 0.0320)
    assert model.cost(128) == cost


def test_cost_model_without_fixed_cost_does_not_probe():
    """Forwards whose time is all per sequence give no fit with overhead >= 0 (here 2 sequences cost more than twice
    one): per-sequence time is the mean, and no probe is asked for."""
    from backend.pow.cost import CostModel
    model = CostModel()
    model.observe(1024, 1, 0.090)
    model.observe(1024, 2, 0.190)
    assert model.cost(1024) == Cost(0.0, 0.140 / 1.5)


def test_share_credit_is_capped_and_debt_repaid():
    account = ChatShare(0.5)
    for _ in range(10):
        account.after_step(STEP_S, is_poc_waiting=True)
    assert account.credit_s == pytest.approx(2 * STEP_S)  # no burst banked while chat was heavy
    account.after_poc(5 * STEP_S, is_chat_waiting=True)  # a forward that overran its size
    assert account.credit_s == pytest.approx(-3 * STEP_S)
    for _ in range(3):
        account.after_step(STEP_S, is_poc_waiting=True)
    assert account.credit_s == pytest.approx(0.0)


def test_share_refuses_a_share_outside_0_1():
    with pytest.raises(ValueError):
        ChatShare(1.5)


# --- forwards beside chat (choose_overlapped): the device's stream priorities share it, the share's ends decide

S = Snapshot
OVERLAPPED = [
    (S(has_engine_work=True), (False, True), "chat only: step"),
    (S(has_engine_work=False), (False, False), "nothing to run"),
    (S(has_engine_work=False, has_poc_work=True), (True, False), "chat idle: launch a forward"),
    (S(has_engine_work=True, has_poc_work=True), (True, True), "both: launch a forward and step beside it"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True), (False, True),
     "a forward runs: chat steps beside it, the next waits for it"),
    (S(has_engine_work=False, has_poc_work=True, is_poc_in_flight=True), (False, False),
     "a forward runs and chat is idle: wait for it"),
    (S(has_engine_work=True, has_poc_work=True, chat_share=1.0), (False, True),
     "share 1: no forward starts while chat has work"),
    (S(has_engine_work=False, is_chat_preparing=True, has_poc_work=True, chat_share=1.0), (False, False),
     "share 1: nor while a request is being tokenized"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, chat_share=1.0), (False, True),
     "share 1: a forward started while chat was idle runs on beside the chat that came"),
    (S(has_engine_work=True, has_poc_work=True, chat_share=0.0), (True, False),
     "share 0: chat waits while PoC has work"),
    (S(has_engine_work=True, is_poc_in_flight=True, chat_share=0.0), (False, False),
     "share 0: chat waits for the forward in flight"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_blocked=True), (False, True),
     "PoC found no free KV blocks: chat steps to free some, no launch"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_blocked=True, chat_share=0.0), (False, True),
     "share 0 but PoC is blocked on blocks chat holds: chat steps"),
    (S(has_engine_work=False, has_poc_work=True, is_poc_blocked=True, is_chat_gated=True), (True, False),
     "blocked but nothing else runs: retry the launch"),
    (S(has_engine_work=True, has_poc_work=True, is_chat_gated=True, chat_share=1.0), (True, True),
     "chat gated (requests draining): the share does not hold PoC back"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=True), (True, True),
     "a forward in flight and a slot behind it: the next is launched beside chat"),
    (S(has_engine_work=False, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=True), (True, False),
     "chat idle: the next forward is queued behind the one running"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=False), (False, True),
     "no slot (two in flight, or the newest not wholly queued): chat steps, no launch"),
    (S(has_engine_work=False, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=True, chat_share=1.0),
     (False, False), "share 1: none queued behind the forward chat may have to wait for"),
    (S(has_engine_work=False, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=True, chat_share=1.0,
       is_chat_gated=True), (True, False), "share 1 but chat gated: the next is queued behind"),
    (S(has_engine_work=True, has_poc_work=True, is_poc_in_flight=True, has_poc_slot=True, is_poc_blocked=True),
     (False, True), "a slot but no free KV blocks: chat steps to free some"),
]


@pytest.mark.parametrize("snapshot,expected,why", OVERLAPPED, ids=[row[2] for row in OVERLAPPED])
def test_policy_choose_overlapped_follows_decision_table(snapshot, expected, why):
    work = policy.choose_overlapped(snapshot)
    assert (work.launch_poc, work.step_chat) == expected, why


# Whether the forward launched is paced (backend/engine/pocworker/pacing.py): chat idle but likely to come back.
PACED = [
    (S(has_engine_work=False, has_poc_work=True, is_chat_quiet=False), True,
     "chat idle, ran within CHAT_QUIET_S: paced, a burst may come"),
    (S(has_engine_work=False, has_poc_work=True), False, "chat quiet for long (mining alone): whole, graphs"),
    (S(has_engine_work=False, has_poc_work=True, is_chat_quiet=False, is_chat_recent=True), False,
     "chat in its linger: launched beside chat already, nothing to pace"),
    (S(has_engine_work=True, has_poc_work=True, is_chat_quiet=False, is_chat_recent=True), False,
     "chat running: beside it on PoC's SMs"),
    (S(has_engine_work=False, has_poc_work=True, is_chat_quiet=False, is_chat_gated=True), False,
     "chat gated (exclusive round): no request can come, whole"),
    (S(has_engine_work=False, has_poc_work=True, is_chat_quiet=False, is_poc_in_flight=True, has_poc_slot=True), True,
     "the next forward behind a paced one: paced too"),
    (S(has_engine_work=False, has_poc_work=True, is_chat_quiet=False, is_poc_in_flight=True, has_poc_slot=False), False,
     "no launch, nothing paced"),
]


@pytest.mark.parametrize("snapshot,paced,why", PACED, ids=[row[2] for row in PACED])
def test_policy_paces_a_forward_launched_while_chat_is_idle_but_recent(snapshot, paced, why):
    assert policy.choose_overlapped(snapshot).paced == paced, why


# --- the loop's path without PoC work (without_poc, overlapped_without_poc): the policy's answer, no snapshot built

def _snapshots_without_poc() -> list[Snapshot]:
    """Every combination of the flags, with the numbers at their ends, where PoC has no work and nothing in flight."""
    flags = [f.name for f in dataclasses.fields(Snapshot)
             if f.type in (bool, "bool") and f.name not in ("has_poc_work", "is_poc_in_flight")]
    numbers = [dict(chat_share=share, poc_credit_s=credit, poc_cost=cost, poc_max_batch=32)
               for share in (0.0, 0.5, 1.0) for credit in (0.0, 1.0, INFINITE) for cost in (None, COST)]
    return [Snapshot(**{name: bool(bits >> i & 1) for i, name in enumerate(flags)}, **extra)
            for bits in range(1 << len(flags)) for extra in numbers]


def test_policy_without_poc_is_what_choose_answers_for_every_snapshot_without_poc_work():
    snapshots = _snapshots_without_poc()
    assert len(snapshots) > 1000 and {s.has_engine_work for s in snapshots} == {True, False}
    for s in snapshots:
        # Spelled out as well: choose() itself answers through without_poc on this path.
        assert policy.choose(s) == (EngineStep() if s.has_engine_work else Idle()), s
        assert policy.without_poc(s.has_engine_work) == policy.choose(s), s
        assert policy.overlapped_without_poc(s.has_engine_work) == policy.choose_overlapped(s), s
