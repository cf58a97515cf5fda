"""POC_GENERATE_CHUNK_TIMEOUT_SEC through the PoC service: a /generate job whose next chunk waits too long for the
engine fails with the fork's texts (a queued job: "Timeout waiting for engine: chunk i"; wait=true: 503 "Timeout
after ...s"); a mining round is not affected. Fake runner and clocks; a real job queue on SQLite."""

from __future__ import annotations

import pytest

from backend.pow.artifact_queue import ArtifactQueue
from backend.pow.jobs import FAILED, GenerateQueue
from backend.pow.service import PowService
from backend.pow.store import Store
from protocol.pow import NodeIdentity, PowGenerateRequest, PowInitRequest, PowJobReply, PowParams, PowStatusReply
from tests.unit.test_artifact_queue import FakeClock, FakeRunner

NODE = NodeIdentity(block_hash="h", block_height=1, public_key="pk", node_id=0, node_count=1)
TIMEOUT_S = 60.0


class FakeCallbacks:
    num_delivered = num_dropped = num_retries = backlog = 0

    def add_generated(self, url, batch) -> None:
        pass

    def enqueue(self, url, path, body) -> None:
        pass


class Service:
    """A PowService whose forwards find no free KV blocks until `runner.blocked` is cleared."""

    def __init__(self, store: Store) -> None:
        self.clock = FakeClock()
        self.runner = FakeRunner()
        self.runner.blocked = True
        self.replies: list = []
        self.jobs = GenerateQueue(store, clock=self.clock)
        self.jobs.load()
        self.pow = PowService(artifacts=ArtifactQueue(self.runner, clock=self.clock), jobs=self.jobs,
                              callbacks=FakeCallbacks(), send=lambda identity, msg: self.replies.append(msg),
                              chat=None, model_names=["m"], mode="shared", default_batch_size=32,
                              chunk_timeout_s=TIMEOUT_S)

    def step(self) -> None:
        """One turn of the loop: feed, a forward (it waits for blocks), the timer."""
        self.pow.feed()
        if len(self.pow.artifacts):
            self.pow.artifacts.run_batch()
        self.pow.on_timer()


@pytest.fixture
def service(tmp_path):
    store = Store(tmp_path / "state.db")
    yield Service(store)
    store.close()


def _generate(**kw) -> PowGenerateRequest:
    return PowGenerateRequest(rid="g", node=NODE, params=PowParams(model="m", seq_len=8), nonces=list(range(8)),
                              **kw)


def test_pow_wait_true_chunk_timeout_answers_503_timeout_after(service):
    service.pow.on_generate(b"fe", _generate(wait=True))
    service.step()
    service.clock.now = TIMEOUT_S - 0.5
    service.step()
    assert service.replies == []
    service.clock.now = TIMEOUT_S + 0.25
    service.step()
    [reply] = service.replies
    assert isinstance(reply, PowJobReply) and reply.job is None
    assert (reply.error.status, reply.error.message) == (503, "Timeout after 60.2s")


def test_pow_queued_job_chunk_timeout_fails_the_job_with_the_forks_text(service):
    service.pow.on_generate(b"fe", _generate(batch_size=4))
    job = service.jobs.peek_next()
    service.step()  # now running, its first chunk waiting for blocks
    service.runner.blocked = False
    service.clock.now = 10.0
    service.step()  # chunk 0 (4 nonces) done at 10 s
    service.runner.blocked = True
    service.clock.now = 10.0 + TIMEOUT_S
    service.step()
    assert (job.status, job.error) == (FAILED, "Timeout waiting for engine: chunk 1")
    assert service.jobs.queued_nonces == 0 and not service.pow.has_work()


def test_pow_mining_round_waits_without_a_timeout(service):
    service.pow.on_init(b"fe", PowInitRequest(rid="i", node=NODE, params=PowParams(model="m", seq_len=8)))
    assert isinstance(service.replies[0], PowStatusReply) and service.replies[0].error is None
    service.step()
    service.clock.now = 100 * TIMEOUT_S
    service.step()
    assert service.pow.round is not None and len(service.pow.artifacts) > 0
    service.runner.blocked = False
    service.step()
    assert service.pow.round.total_processed > 0
