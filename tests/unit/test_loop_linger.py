"""The engine loop's linger: chat counts as running for CHAT_LINGER_S after its last request, and PoC waits it out on
the inbox (a message wakes it) instead of spinning or starting a forward the next request would wait behind."""

from __future__ import annotations

import queue
import time
from types import SimpleNamespace

import pytest

from backend.core import loop as loop_module
from backend.core import policy
from backend.core.loop import CHAT_LINGER_S, BackendLoop
from backend.core.share import ChatShare


class FakeChat:
    def __init__(self) -> None:
        self.work = False
        self.preparing = False
        self.is_gated = False

    def has_work(self) -> bool:
        return self.work

    def is_preparing(self) -> bool:
        return self.preparing

    def handlers(self) -> dict:
        return {}


class RecordingInbox:
    """An empty inbox that records how long each blocking get would have waited."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def get(self, timeout: float):
        self.timeouts.append(timeout)
        raise queue.Empty

    def get_nowait(self):
        raise queue.Empty


@pytest.fixture
def clock(monkeypatch):
    """A clock for the loop module alone (patching time.monotonic itself would move every thread's clock)."""
    now = SimpleNamespace(t=1000.0)
    monkeypatch.setattr(loop_module, "time", SimpleNamespace(monotonic=lambda: now.t, perf_counter=time.perf_counter))
    return now


class FakeArtifacts(list):
    """The artifact queue as these tests see it: its batches and whether a forward is in flight."""

    is_in_flight = False


def _loop(chat: FakeChat, inbox=None, has_batch: bool = False) -> BackendLoop:
    pow = SimpleNamespace(handlers=lambda: {}, feed=lambda: None, has_work=lambda: False)
    artifacts = FakeArtifacts(["batch"] if has_batch else [])
    engine = SimpleNamespace(poc=SimpleNamespace(release=lambda: None, overlaps=False))
    return BackendLoop(engine, inbox or queue.Queue(), None, chat=chat, pow=pow, artifacts=artifacts,
                       send=lambda *a: None, share=ChatShare(0.5))


def test_linger_runs_from_chats_last_request(clock):
    chat = FakeChat()
    loop = _loop(chat)
    assert loop.linger_s() == 0.0  # chat never ran
    chat.work = True
    assert loop.linger_s() == pytest.approx(CHAT_LINGER_S)
    clock.t += 5.0
    assert loop.linger_s() == pytest.approx(CHAT_LINGER_S)  # still running: the linger starts when it stops
    chat.work = False
    clock.t += 0.4 * CHAT_LINGER_S
    assert loop.linger_s() == pytest.approx(0.6 * CHAT_LINGER_S)
    clock.t += 0.7 * CHAT_LINGER_S
    assert loop.linger_s() == 0.0


def test_linger_counts_a_request_being_prepared(clock):
    chat = FakeChat()
    loop = _loop(chat)
    chat.preparing = True
    loop.linger_s()
    chat.preparing = False
    clock.t += 0.5 * CHAT_LINGER_S
    assert loop.linger_s() == pytest.approx(0.5 * CHAT_LINGER_S)


def test_idle_with_poc_waiting_blocks_on_the_inbox_for_the_linger(clock):
    chat, inbox = FakeChat(), RecordingInbox()
    loop = _loop(chat, inbox, has_batch=True)
    chat.work = True
    loop.linger_s()
    chat.work = False
    clock.t += 0.25 * CHAT_LINGER_S
    loop.execute(policy.Idle())
    assert inbox.timeouts == [pytest.approx(0.75 * CHAT_LINGER_S)]


def test_idle_with_nothing_waiting_does_not_block(clock):
    inbox = RecordingInbox()
    _loop(FakeChat(), inbox, has_batch=False).execute(policy.Idle())
    assert inbox.timeouts == []  # the next turn's ingest blocks, with the loop's own idle wait


def test_chat_alone_runs_without_a_snapshot_and_still_keeps_its_linger(clock, monkeypatch):
    """With no PoC work the loop takes the policy's answer without building a snapshot (a chat step's host time),
    yet still notes when chat last ran: a PoC batch arriving just after chat must find chat lingering."""
    chat = FakeChat()
    loop = _loop(chat)
    executed: list = []
    monkeypatch.setattr(loop, "snapshot", lambda: pytest.fail("a snapshot built without PoC work"))
    monkeypatch.setattr(loop, "execute", executed.append)
    monkeypatch.setattr(loop, "publish", lambda: None)
    chat.work = True
    loop.run_once()
    assert executed == [policy.EngineStep()]
    chat.work = False
    clock.t += 0.5 * CHAT_LINGER_S
    loop.artifacts.append("batch")  # PoC work comes: its snapshot reads the linger
    assert loop.linger_s() == pytest.approx(0.5 * CHAT_LINGER_S)
