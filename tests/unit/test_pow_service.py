"""A PoC job's one path through backend/pow/service.py: its work is built and checked once when the request comes and
that same work reaches the artifact queue; a job loaded from the store after a restart is checked against the new
engine, and one it can no longer run fails with the reason instead of failing in the workers."""

from __future__ import annotations

from backend.pow.jobs import COMPLETED, FAILED
from backend.pow.store import Store
from poc.errors import PocInputError
from poc.spec import ArtifactJob
from protocol.pow import PowJobReply
from tests.unit.test_pow_chunk_timeout import Service, _generate


class Checks:
    """FakeRunner.check, recording each job it was asked about; refuses seq_len above `max_seq_len`."""

    def __init__(self, max_seq_len: int = 1 << 20) -> None:
        self.jobs: list[ArtifactJob] = []
        self.max_seq_len = max_seq_len

    def __call__(self, job: ArtifactJob) -> None:
        self.jobs.append(job)
        if job.spec.seq_len > self.max_seq_len:
            raise PocInputError("seq_len", f"seq_len must be in [1, {self.max_seq_len}] on this engine")


def _service(store: Store, checks: Checks) -> Service:
    service = Service(store)
    service.runner.blocked = False
    service.runner.check = checks
    return service


def _run(service: Service) -> None:
    while service.pow.has_work():
        service.step()


def test_pow_queued_job_is_built_and_checked_once_and_that_work_runs(tmp_path):
    store = Store(tmp_path / "state.db")
    checks = Checks()
    service = _service(store, checks)
    service.pow.on_generate(b"fe", _generate(batch_size=4))
    job = service.jobs.peek_next()
    service.pow.feed()
    [checked] = checks.jobs
    [task] = service.pow.artifacts._jobs
    assert task.job is checked and checked.nonces == tuple(range(8))
    _run(service)
    assert checks.jobs == [checked] and job.status == COMPLETED
    assert service.runner.forwards == [("h", 4), ("h", 4)]  # FakeRunner's forwards take 4
    store.close()


def test_pow_wait_true_job_is_checked_once_and_answered(tmp_path):
    store = Store(tmp_path / "state.db")
    checks = Checks()
    service = _service(store, checks)
    service.pow.on_generate(b"fe", _generate(wait=True))
    _run(service)
    [reply] = service.replies
    assert isinstance(reply, PowJobReply) and reply.error is None and reply.job.status == "completed"
    assert len(checks.jobs) == 1
    store.close()


def test_pow_job_refused_at_request_never_reaches_the_queue(tmp_path):
    store = Store(tmp_path / "state.db")
    service = _service(store, Checks(max_seq_len=4))
    service.pow.on_generate(b"fe", _generate())
    [reply] = service.replies
    assert (reply.error.status, reply.error.param) == (400, "params.seq_len")
    assert service.jobs.peek_next() is None and not service.pow.has_work()
    store.close()


def test_pow_job_loaded_after_a_restart_is_checked_against_the_new_engine(tmp_path):
    store = Store(tmp_path / "state.db")
    before = _service(store, Checks())
    before.pow.on_generate(b"fe", _generate())
    job_id = before.jobs.peek_next().id
    store.close()  # the process ends with the job queued

    store = Store(tmp_path / "state.db")
    checks = Checks(max_seq_len=4)  # restarted with a smaller engine: seq_len 8 no longer fits
    after = _service(store, checks)
    assert after.jobs.peek_next().id == job_id
    _run(after)
    job = after.jobs.get(job_id)
    assert job.status == FAILED and "seq_len must be in [1, 4]" in job.error
    assert len(checks.jobs) == 1 and after.runner.forwards == []
    store.close()
