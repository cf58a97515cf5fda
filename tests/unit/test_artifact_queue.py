"""Unit tests for backend/pow/artifact_queue.py with a fake runner: jobs before the round's batches, jobs
round-robin, the round's guaranteed share while jobs wait, sized forwards, failures and blocked forwards, and the
chunk timeout (on a fake clock)."""

from __future__ import annotations

from collections import deque

import pytest

from backend.engine.poc import Flight, ForwardsLost, NoFreeBlocks
from backend.errors import pow_error
from backend.pow.artifact_queue import MINING, MINING_EVERY, ArtifactQueue, ArtifactTask, ChunkTimeout
from poc.spec import ArtifactJob, PocSpec

MAX_BATCH = 4


class FakeRunner:
    """Runs forwards instantly; records which job each forward served and how many nonces it took."""

    def __init__(self) -> None:
        self.forwards: list[tuple[str, int]] = []
        self.fail_for: str | None = None
        self.blocked = False

    def check(self, job: ArtifactJob) -> None:
        pass

    def max_batch(self, seq_len: int) -> int:
        return MAX_BATCH

    def run(self, job: ArtifactJob, nonces: list[int]):
        if self.blocked:
            raise NoFreeBlocks("all blocks in use")
        if job.spec.block_hash == self.fail_for:
            raise RuntimeError("worker failed")
        self.forwards.append((job.spec.block_hash, len(nonces)))
        return [(n, f"v{n}") for n in nonces], len(nonces)


class Done:
    def __init__(self) -> None:
        self.calls: list[tuple[list, object]] = []

    def __call__(self, artifacts, error) -> None:
        self.calls.append((artifacts, error))


def _task(name: str, num_nonces: int, tag: str = "job", seq_len: int = 8) -> tuple[ArtifactTask, Done]:
    done = Done()
    return ArtifactTask(job=ArtifactJob(PocSpec(name, "pk", seq_len), tuple(range(num_nonces))), done=done,
                        tag=tag), done


def _queue() -> tuple[ArtifactQueue, FakeRunner]:
    runner = FakeRunner()
    return ArtifactQueue(runner), runner


def _drain(queue: ArtifactQueue) -> None:
    while len(queue):
        queue.run_batch()


def test_artifact_queue_job_goes_before_the_rounds_next_batch():
    queue, runner = _queue()
    mining, _ = _task("round", 4, MINING)
    queue.submit(mining)
    job, done = _task("validation", 4)
    queue.submit(job)
    queue.run_batch()
    assert runner.forwards == [("validation", 4)] and done.calls[0][1] is None
    queue.run_batch()
    assert runner.forwards[-1] == ("round", 4)


def test_artifact_queue_jobs_share_round_robin_so_a_small_job_never_waits_for_a_big_one():
    queue, runner = _queue()
    big, big_done = _task("big", 40)
    small, small_done = _task("small", 2)
    queue.submit(big)
    queue.submit(small)
    queue.run_batch()
    queue.run_batch()
    assert [name for name, _ in runner.forwards] == ["big", "small"] and small_done.calls and not big_done.calls
    _drain(queue)
    [(artifacts, error)] = big_done.calls
    assert error is None and [a.nonce for a in artifacts] == list(range(40))


def test_artifact_queue_round_gets_one_forward_in_mining_every_while_jobs_wait():
    queue, runner = _queue()
    job, _ = _task("jobs", 4 * 10 * MINING_EVERY)
    queue.submit(job)
    for _ in range(3):
        mining, _ = _task("round", 4, MINING)
        queue.submit(mining)
        for _ in range(MINING_EVERY):
            queue.run_batch()
    names = [name for name, _ in runner.forwards]
    assert names.count("round") == 3
    assert names == (["jobs"] * (MINING_EVERY - 1) + ["round"]) * 3


def test_artifact_queue_forward_takes_at_most_the_limit_and_learns_its_cost():
    ticks = iter([0.0, 0.5, 1.0, 1.6])  # 3 sequences: 0.5 s, 4 sequences: 0.6 s
    queue = ArtifactQueue(FakeRunner(), clock=lambda: next(ticks))
    job, _ = _task("job", 10, seq_len=64)
    queue.submit(job)
    assert queue.next_forward() == (None, MAX_BATCH)
    queue.run_batch(limit=3)
    queue.run_batch(limit=100)  # capped by what one forward takes
    cost, max_batch = queue.next_forward()
    assert cost is not None and cost.overhead_s == pytest.approx(0.2) and cost.per_seq_s == pytest.approx(0.1)
    assert max_batch == 3 and job.remaining == list(range(7, 10))  # what is left of the task
    assert queue.iterations.count == 2 and queue.iterations.sum == (3 + 4) * 64


def test_artifact_queue_failed_forward_fails_only_its_task():
    queue, runner = _queue()
    runner.fail_for = "bad"
    bad, bad_done = _task("bad", 4)
    good, good_done = _task("good", 4)
    queue.submit(bad)
    queue.submit(good)
    _drain(queue)
    assert bad_done.calls[0][0] == [] and bad_done.calls[0][1].status == 500
    assert good_done.calls[0][1] is None and len(good_done.calls[0][0]) == 4


def test_artifact_queue_no_free_blocks_keeps_the_task_and_marks_blocked():
    queue, runner = _queue()
    runner.blocked = True
    job, done = _task("job", 4)
    queue.submit(job)
    queue.run_batch()
    assert queue.is_blocked and len(queue) == 1 and not done.calls
    queue.unblock()
    runner.blocked = False
    queue.run_batch()
    assert not queue.is_blocked and done.calls


def test_artifact_queue_discard_drops_the_rounds_batches_only():
    queue, _ = _queue()
    mining, mining_done = _task("round", 4, MINING)
    job, job_done = _task("job", 4)
    queue.submit(mining)
    queue.submit(job)
    assert queue.discard(lambda t: t.tag == MINING) == 1
    assert len(queue) == 1 and not mining_done.calls
    queue.run_batch()  # what is left is the job
    assert job_done.calls and not mining_done.calls


# --- forwards beside chat: launch_batch queues one (a second behind it), poll_batch finishes the oldest


class LaunchingRunner(FakeRunner):
    """A runner whose forwards run beside chat, two at most: launch returns at once, poll answers the oldest once
    `finished` is set. As backend/engine/poc.py's, it keeps the forwards in flight (the queue keeps none)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: deque[tuple[str, list[int]]] = deque()
        self._flights: deque[Flight] = deque()
        self.finished = False

    @property
    def launched(self) -> tuple[str, list[int]] | None:
        """The newest forward launched."""
        return self.in_flight[-1] if self.in_flight else None

    @property
    def is_in_flight(self) -> bool:
        return bool(self._flights)

    @property
    def is_pipelined(self) -> bool:
        return bool(self._flights) and self._flights[0].pipelined

    @property
    def can_launch(self) -> bool:
        return len(self.in_flight) < 2

    def launch(self, job: ArtifactJob, nonces: list[int], is_chat_running: bool, budget_s: float,
               owner=None, paced: bool = False, pipelined: bool = False) -> int:
        if self.blocked:
            raise NoFreeBlocks("all blocks in use")
        assert self.can_launch
        self.in_flight.append((job.spec.block_hash, nonces))
        self._flights.append(Flight(owner, len(nonces), pipelined))
        return len(nonces)

    def poll(self, wait: bool = False, budget_s: float = 0.0, is_chat_running: bool = False):
        assert self.in_flight
        if not (self.finished or wait):
            return None
        name, nonces = self.in_flight.popleft()
        if name == self.fail_for:
            lost = [self._flights.popleft(), *self._flights]
            self.in_flight.clear()  # as the workers: a failure drops every forward in flight
            self._flights.clear()
            raise ForwardsLost(lost, RuntimeError("worker failed"))
        self.forwards.append((name, len(nonces)))
        return self._flights.popleft(), [(n, f"v{n}") for n in nonces]


def test_artifact_queue_second_forward_takes_the_nonces_the_first_does_not_hold():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    job, done = _task("validation", 6)
    queue.submit(job)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert queue.has_slot
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert [nonces for _, nonces in runner.in_flight] == [[0, 1, 2, 3], [4, 5]]
    assert not queue.has_slot  # the runner takes no third, and no nonce is left
    runner.finished = True
    queue.poll_batch()
    assert job.remaining == [4, 5] and job.launched == 2 and not queue.has_slot and not done.calls
    queue.poll_batch()
    assert [(a.nonce, a.vector_b64) for a in done.calls[0][0]] == [(n, f"v{n}") for n in range(6)]
    assert not queue.is_in_flight and len(queue) == 0


def test_artifact_queue_second_forward_comes_from_the_next_task_when_the_first_is_all_in_flight():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    first, first_done = _task("round-1", 4, MINING)
    second, second_done = _task("round-2", 4, MINING)
    job, job_done = _task("validation", 2)
    queue.submit(first)
    queue.submit(second)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.submit(job)  # a job arriving during the round goes before the round's next batch
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert [name for name, _ in runner.in_flight] == ["round-1", "validation"]
    runner.finished = True
    queue.poll_batch()
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert [name for name, _ in runner.in_flight] == ["validation", "round-2"]
    queue.poll_batch()
    queue.poll_batch()
    assert first_done.calls and job_done.calls and second_done.calls and len(queue) == 0


def _bad_then_good() -> tuple[LaunchingRunner, ArtifactQueue, Done, ArtifactTask, Done]:
    """A queue holding a task whose forward fails ("bad") before one whose forward succeeds ("good")."""
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    bad, bad_done = _task("bad", 4)
    good, good_done = _task("good", 4)
    queue.submit(bad)
    queue.submit(good)
    runner.fail_for = "bad"
    return runner, queue, bad_done, good, good_done


def test_artifact_queue_failed_oldest_forward_fails_its_task_and_the_next_runs_again():
    runner, queue, bad_done, good, good_done = _bad_then_good()
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.poll_batch(wait=True)
    assert bad_done.calls[0][1].message == "PoC forward failed: worker failed" and bad_done.calls[0][0] == []
    assert not queue.is_in_flight and good.launched == 0 and queue.has_slot
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert runner.launched == ("good", [0, 1, 2, 3])
    queue.poll_batch(wait=True)
    assert good_done.calls[0][1] is None and len(queue) == 0


def test_artifact_queue_launched_forward_finishes_its_task_when_polled_done():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    job, done = _task("validation", 6)
    queue.submit(job)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert queue.is_in_flight and runner.launched == ("validation", [0, 1, 2, 3])
    queue.poll_batch()
    assert queue.is_in_flight and not done.calls  # still running
    runner.finished = True
    queue.poll_batch()
    assert not queue.is_in_flight and job.remaining == [4, 5] and not done.calls
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.poll_batch(wait=True)
    assert [(a.nonce, a.vector_b64) for a in done.calls[0][0]] == [(n, f"v{n}") for n in range(6)]
    assert done.calls[0][1] is None and len(queue) == 0
    assert queue.iterations.count == 2 and queue.costs.cost(8) is None  # beside chat: no cost learned


def test_artifact_queue_forward_of_a_task_stopped_in_flight_is_dropped():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    mining, done = _task("round", 4, MINING)
    queue.submit(mining)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert queue.discard(lambda task: task.tag == MINING) == 1  # /stop while the forward runs
    queue.poll_batch(wait=True)
    assert not queue.is_in_flight and not done.calls and len(queue) == 0


def test_artifact_queue_failed_launched_forward_fails_its_task_only():
    _, queue, bad_done, _, good_done = _bad_then_good()
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.poll_batch(wait=True)
    assert bad_done.calls[0][0] == [] and "PoC forward failed" in bad_done.calls[0][1].message
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.poll_batch(wait=True)
    assert good_done.calls[0][1] is None and len(queue) == 0


def test_artifact_queue_launch_without_free_blocks_waits_for_a_step():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    job, done = _task("validation", 4)
    queue.submit(job)
    runner.blocked = True
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    assert queue.is_blocked and not queue.is_in_flight and len(queue) == 1
    queue.unblock()
    runner.blocked = False
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.poll_batch(wait=True)
    assert done.calls[0][1] is None and not queue.is_blocked


def test_artifact_queue_no_second_forward_while_the_last_launch_found_no_free_blocks():
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner)
    job, done = _task("validation", 8)
    queue.submit(job)
    queue.launch_batch(is_chat_running=False, budget_s=float("inf"))
    runner.blocked = True
    queue.launch_batch(is_chat_running=False, budget_s=float("inf"))
    assert queue.is_blocked and not queue.has_slot  # no retry loop while the first forward runs
    runner.blocked, runner.finished = False, True
    queue.poll_batch()
    assert not queue.is_blocked and queue.has_slot and job.launched == 0
    queue.launch_batch(is_chat_running=False, budget_s=float("inf"))
    queue.poll_batch()
    assert [a.nonce for a in done.calls[0][0]] == list(range(8))


# --- the chunk timeout (POC_GENERATE_CHUNK_TIMEOUT_SEC): a /generate task whose next chunk waits too long fails


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timeout_error(chunk: int, waited_s: float):
    return pow_error(503, f"chunk {chunk} waited {waited_s:g}").info()


def _timed(name: str, num_nonces: int, seconds: float = 60.0, chunk_size: int = 4) -> tuple[ArtifactTask, Done]:
    task, done = _task(name, num_nonces)
    task.timeout = ChunkTimeout(seconds, chunk_size, _timeout_error)
    return task, done


def test_artifact_queue_chunk_waiting_for_blocks_times_out_and_leaves_the_queue():
    clock = FakeClock()
    runner = FakeRunner()
    queue = ArtifactQueue(runner, clock=clock)
    job, done = _timed("validation", 4)
    queue.submit(job)
    runner.blocked = True
    queue.run_batch()  # no free KV blocks: the chunk keeps waiting
    clock.now = 59.9
    assert queue.expire() == 0 and len(queue) == 1
    clock.now = 60.0
    assert queue.expire() == 1
    [(artifacts, error)] = done.calls
    assert artifacts == [] and error.status == 503 and error.message == "chunk 0 waited 60"
    assert len(queue) == 0 and queue.expire() == 0  # done() is called once


def test_artifact_queue_chunk_clock_restarts_after_each_forward_and_names_the_chunk():
    clock = FakeClock()
    queue = ArtifactQueue(FakeRunner(), clock=clock)
    job, done = _timed("validation", 12, chunk_size=4)  # chunks of 4; forwards of MAX_BATCH = 4
    queue.submit(job)
    clock.now = 50.0
    queue.run_batch()  # chunk 0 done at 50 s: chunk 1 waits from here
    clock.now = 105.0
    assert queue.expire() == 0
    queue.run_batch()  # chunk 1 done at 105 s
    clock.now = 165.0
    assert queue.expire() == 1
    assert done.calls[0][1].message == "chunk 2 waited 60"


def test_artifact_queue_chunk_timeout_spares_forwards_in_flight_mining_and_tasks_without_one():
    clock = FakeClock()
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner, clock=clock)
    job, done = _timed("validation", 4)
    mining, mining_done = _task("round", 4, MINING)
    direct, direct_done = _task("direct", 4, tag="direct")
    queue.submit(job)
    queue.submit(direct)
    queue.submit(mining)
    queue.launch_batch(is_chat_running=False, budget_s=float("inf"))
    assert runner.launched == ("validation", [0, 1, 2, 3])
    clock.now = 1000.0
    assert queue.expire() == 0  # the engine holds its chunk: the fork never times a running chunk out either
    runner.finished = True
    queue.poll_batch()
    assert done.calls[0][1] is None
    assert queue.expire() == 0 and len(queue) == 2 and not mining_done.calls and not direct_done.calls


def test_artifact_queue_chunk_clock_restarts_when_a_failed_forward_returns_the_next_ones_nonces():
    clock = FakeClock()
    runner = LaunchingRunner()
    queue = ArtifactQueue(runner, clock=clock)
    bad, bad_done = _task("bad", 4)
    good, good_done = _timed("good", 4)
    queue.submit(bad)
    queue.submit(good)
    runner.fail_for = "bad"
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    queue.launch_batch(is_chat_running=True, budget_s=0.001)
    clock.now = 100.0
    queue.poll_batch(wait=True)  # the failure drops "good"'s forward too: it waits again from 100 s
    assert bad_done.calls and good.launched == 0
    clock.now = 159.0
    assert queue.expire() == 0
    clock.now = 160.0
    assert queue.expire() == 1 and good_done.calls[0][1].message == "chunk 0 waited 60"


class ChunkedRunner(LaunchingRunner):
    """A forward parked between layers: each launch or poll call computes for CHUNK_S on the queue's clock."""

    CHUNK_S = 0.03

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def launch(self, *args, **kw) -> int:
        self.clock.now += self.CHUNK_S
        return super().launch(*args, **kw)

    def poll(self, wait: bool = False, budget_s: float = 0.0, is_chat_running: bool = False):
        self.clock.now += self.CHUNK_S
        return super().poll(wait, budget_s, is_chat_running)


def _chunked(num_nonces: int) -> tuple[FakeClock, ChunkedRunner, ArtifactQueue, ArtifactTask, Done]:
    clock = FakeClock()
    runner = ChunkedRunner(clock)
    queue = ArtifactQueue(runner, clock=clock)
    job, done = _task("validation", num_nonces)
    queue.submit(job)
    return clock, runner, queue, job, done


def test_artifact_queue_parked_forward_takes_its_limit_and_its_chunks_teach_the_cost():
    clock, runner, queue, job, done = _chunked(6)
    queue.launch_batch(False, 0.03, limit=2, timed=True)
    assert runner.launched == ("validation", [0, 1]) and queue.is_in_flight
    queue.poll_batch(budget_s=0.03, timed=True)  # the next chunk of layers: not done yet
    assert queue.costs.cost(8) is None
    clock.now += 5.0  # chat steps between the chunks: not the forward's time
    runner.finished = True
    queue.poll_batch(budget_s=0.03, timed=True)
    assert not queue.is_in_flight and job.remaining == [2, 3, 4, 5] and not done.calls
    assert queue.costs.cost(8).seconds(2) == pytest.approx(3 * ChunkedRunner.CHUNK_S)


def test_artifact_queue_forward_launched_beside_chat_teaches_no_cost():
    """Overlapped forwards (GPU, beside chat's steps) share the device: their wall time is not their cost."""
    _, runner, queue, _, _ = _chunked(2)
    queue.launch_batch(True, 0.001)
    runner.finished = True
    queue.poll_batch(budget_s=0.001)
    assert len(queue) == 0 and queue.costs.cost(8) is None
