"""PoC artifact work between engine steps: jobs first, a mining round's batches after.

Two lanes. The job lane holds /generate jobs (with or without wait) and direct artifact requests; the mining lane
holds the round's batches. A validation decides another node's vote and has a deadline, so jobs go before the
round: a job that arrives during mining waits for the forwards in flight only (two at most). Jobs share the job
lane round-robin, one forward each, so a small job never waits for a large one. While jobs wait, the round still
gets one forward in every MINING_EVERY, so a stream of jobs slows mining but never stops it (jobs keep 7/8 of the
device, mining 1/8).

A /generate task may carry a ChunkTimeout (the fork's POC_GENERATE_CHUNK_TIMEOUT_SEC): `expire()`, called on the
loop's timer, fails it once its next chunk has waited that long for the engine with no forward of it running or
finished meanwhile (free KV blocks, other jobs, chat's share of the device). Mining and direct requests have none.

`run_batch(limit)` runs one forward of at most `limit` nonces (the policy's size for it when chat shares the device)
and records its duration, so the policy can size the next one. Where the runner overlaps forwards with chat's
steps, or pipelines an exclusive round's (time-sliced), `launch_batch()` queues a whole forward and `poll_batch()`
finishes the oldest; the runner may take a second behind the first (`has_slot`), from the nonces no forward in
flight holds yet.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from backend.engine.poc import ForwardsLost, NoFreeBlocks
from backend.errors import RequestFailed
from backend.iterations import IterationHistogram
from backend.pow.cost import Cost, CostModel
from poc.spec import ArtifactJob
from protocol.common import ErrorInfo
from protocol.poc import Artifact

log = structlog.get_logger(__name__)

MINING = "mining"
# While jobs wait, every MINING_EVERY-th forward is the round's.
MINING_EVERY = 8


@dataclass
class ChunkTimeout:
    """How long a /generate task's next chunk of `chunk_size` nonces may wait for the engine. As in the fork, the
    clock stops while a forward of the task runs (the fork checks it only while the engine turns a chunk away) and
    starts again from each forward's end."""

    seconds: float
    chunk_size: int
    # What the task fails with: (index of the chunk that waited, seconds it waited) -> the error. The service words
    # it: the fork fails a queued job and a wait=true request with different texts.
    error: Callable[[int, float], ErrorInfo]
    waiting_since: float = 0.0


@dataclass
class ArtifactTask:
    job: ArtifactJob
    # Called once with (artifacts, None) or ([], error).
    done: Callable[[list[Artifact], ErrorInfo | None], None]
    # What submitted it ("mining", "job", "direct"): mining tasks go to their own lane, and /stop drops them.
    tag: str = "direct"
    remaining: list[int] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    # How many of `remaining`, from its head, forwards in flight hold (they finish in launch order).
    launched: int = 0
    # None: the task waits as long as it takes.
    timeout: ChunkTimeout | None = None

    def __post_init__(self) -> None:
        self.remaining = list(self.job.nonces)


class ArtifactQueue:
    def __init__(self, runner, clock: Callable[[], float] = time.perf_counter) -> None:
        self._runner = runner
        self._clock = clock
        self._jobs: deque[ArtifactTask] = deque()
        self._mining: deque[ArtifactTask] = deque()
        # Job forwards since the round's last one.
        self._num_job_forwards = 0
        self.is_blocked = False
        # One observation (tokens = nonces × seq_len) per forward: PoC work moves vllm:iteration_tokens_total too.
        self.iterations = IterationHistogram()
        # What forwards cost, learned from the ones that ran alone (the time-sliced policy sizes them by it).
        self.costs = CostModel()
        # Seconds the forward in flight has computed so far, where it runs only while the engine thread waits for
        # it (a parked one, advanced chunk by chunk): its cost is learned from them as a run_batch's is. None where
        # it is not timed.
        self._timed_s: float | None = None

    def __len__(self) -> int:
        return len(self._jobs) + len(self._mining)

    def check(self, job: ArtifactJob) -> None:
        """Raises PocInputError (naming the field) for a job this engine cannot run."""
        self._runner.check(job)

    def max_batch(self, seq_len: int) -> int:
        """Nonces one forward takes at `seq_len` (a task with more runs as several forwards)."""
        return self._runner.max_batch(seq_len)

    def submit(self, task: ArtifactTask) -> None:
        """Queues a task its submitter has checked (`check`) when it accepted it."""
        self._restart_clock(task)
        (self._mining if task.tag == MINING else self._jobs).append(task)

    def expire(self) -> int:
        """Fails the tasks whose next chunk has waited their ChunkTimeout (none of their forwards in flight);
        returns how many. Only job-lane tasks carry one."""
        now = None
        expired: list[tuple[ArtifactTask, ChunkTimeout, float]] = []
        for task in self._jobs:
            if task.timeout is None or task.launched:
                continue
            now = self._clock() if now is None else now
            waited = now - task.timeout.waiting_since
            if waited >= task.timeout.seconds:
                expired.append((task, task.timeout, waited))
        for task, timeout, waited in expired:
            self._jobs.remove(task)
            chunk = (len(task.job.nonces) - len(task.remaining)) // timeout.chunk_size
            log.warning("poc_job_chunk_timeout", chunk=chunk, waited_s=round(waited, 1), timeout_s=timeout.seconds,
                        num_nonces=len(task.job.nonces), num_done=len(task.artifacts))
            task.done([], timeout.error(chunk, waited))
        return len(expired)

    def discard(self, predicate) -> int:
        """Drops queued tasks matching `predicate` without calling them back; returns how many."""
        num = len(self)
        self._jobs = deque(t for t in self._jobs if not predicate(t))
        self._mining = deque(t for t in self._mining if not predicate(t))
        return num - len(self)

    def next_forward(self) -> tuple[Cost | None, int]:
        """The forward run_batch would run next: its learned cost (None: none of its seq_len ran yet) and the most
        sequences it can take (0: nothing queued)."""
        picked = self._pick()
        if picked is None:
            return None, 0
        task = picked[1]
        seq_len = task.job.spec.seq_len
        return self.costs.cost(seq_len), min(len(task.remaining) - task.launched, self._runner.max_batch(seq_len))

    def _pick(self) -> tuple[bool, ArtifactTask] | None:
        """(from the job lane, the task) of the next forward: the first task with nonces no forward in flight
        holds, in the lane whose turn it is (the other's if that one has none)."""
        jobs_first = bool(self._jobs) and (not self._mining or self._num_job_forwards < MINING_EVERY - 1)
        for lane in (self._jobs, self._mining) if jobs_first else (self._mining, self._jobs):
            for task in lane:
                if len(task.remaining) > task.launched:
                    return lane is self._jobs, task
        return None

    def run_batch(self, limit: int | None = None) -> None:
        """One forward of the next task: at most `limit` nonces (None: as many as a forward takes)."""
        is_job, task, batch = self._take(limit)
        started = self._clock()
        try:
            artifacts, num_run = self._runner.run(task.job, batch)
        except NoFreeBlocks as e:
            self._wait_for_blocks(e)
            return
        except Exception as e:  # one job failed in the worker; the engine may still be fine
            self._failed(is_job, task, len(batch), e)
            return
        self.costs.observe(task.job.spec.seq_len, num_run, self._clock() - started)
        self._finish(is_job, task, artifacts, num_run)

    # --- forwards beside chat (the runner overlaps them with engine steps): launch one, poll it, launch the next

    @property
    def is_in_flight(self) -> bool:
        return self._runner.is_in_flight

    @property
    def is_pipelined(self) -> bool:
        """The forwards in flight were launched pipelined (PocRunner.pipelines)."""
        return self._runner.is_pipelined

    @property
    def has_slot(self) -> bool:
        """launch_batch may start a forward now: the runner takes one more, a task has nonces for it, and the last
        launch found free KV blocks (if it did not, the forward in flight or an engine step frees some first)."""
        return not self.is_blocked and self._runner.can_launch and self._pick() is not None

    def launch_batch(self, is_chat_running: bool, budget_s: float, limit: int | None = None,
                     timed: bool = False, paced: bool = False, pipelined: bool = False) -> None:
        """Starts a forward of the next task (at most `limit` nonces) beside chat's steps, queueing what `budget_s`
        of host time allows; `poll_batch` queues the rest and finishes it. `timed`: the forward runs only inside
        these calls (a parked one, time-sliced), so their time is its cost. `paced`, `pipelined`: see
        PocRunner.launch."""
        is_job, task, batch = self._take(limit)
        started = self._clock()
        try:
            num_run = self._runner.launch(task.job, batch, is_chat_running, budget_s, owner=(is_job, task),
                                          paced=paced, pipelined=pipelined)
        except NoFreeBlocks as e:
            self._wait_for_blocks(e)
            return
        except Exception as e:
            self._failed(is_job, task, len(batch), e)
            return
        task.launched += num_run
        self._timed_s = self._clock() - started if timed else None

    def poll_batch(self, wait: bool = False, budget_s: float = float("inf"), timed: bool = False,
                   is_chat_running: bool = False) -> None:
        """Queues more of the newest forward launched, and finishes the oldest if it is done (or once it is, with
        `wait`). A failure fails the oldest's task; the nonces of the others in flight are run again."""
        started = self._clock()
        try:
            polled = self._runner.poll(wait, budget_s, is_chat_running=is_chat_running)
        except ForwardsLost as lost:
            for flight in lost.flights:
                _, other = flight.owner
                other.launched -= flight.num_nonces
                self._restart_clock(other)  # its forward ran until now: it waits again from here
            failed = lost.flights[0]
            is_job, task = failed.owner
            self._failed(is_job, task, failed.num_nonces, lost)
            return
        if self._timed_s is not None:
            self._timed_s = self._timed_s + self._clock() - started if timed else None
        if polled is None:
            return
        flight, artifacts = polled
        is_job, task = flight.owner
        task.launched -= flight.num_nonces
        if self._timed_s is not None:
            self.costs.observe(task.job.spec.seq_len, flight.num_nonces, self._timed_s)
            self._timed_s = None
        self._finish(is_job, task, artifacts, flight.num_nonces)

    def _take(self, limit: int | None) -> tuple[bool, ArtifactTask, list[int]]:
        """(from the job lane, the next task, the nonces of its next forward: at most `limit`)."""
        picked = self._pick()
        assert picked is not None, "no task has nonces to run"
        is_job, task = picked
        most = self._runner.max_batch(task.job.spec.seq_len)
        size = most if limit is None else max(1, min(limit, most))
        return is_job, task, task.remaining[task.launched:task.launched + size]

    def _queued(self, is_job: bool, task: ArtifactTask) -> deque[ArtifactTask] | None:
        """The task's lane if the task is still in it (a /stop may have dropped it while its forward ran)."""
        lane = self._jobs if is_job else self._mining
        return lane if any(t is task for t in lane) else None

    def _restart_clock(self, task: ArtifactTask) -> None:
        if task.timeout is not None:  # the clock is read only for tasks that need it
            task.timeout.waiting_since = self._clock()

    def _wait_for_blocks(self, e: NoFreeBlocks) -> None:
        # Running requests hold the KV cache: let engine steps finish some before trying again.
        self.is_blocked = True
        log.debug("poc_batch_waits_for_blocks", reason=str(e))

    def _failed(self, is_job: bool, task: ArtifactTask, num_nonces: int, e: Exception) -> None:
        log.exception("poc_batch_failed", num_nonces=num_nonces)  # called in the except block
        lane = self._queued(is_job, task)
        if lane is not None:
            lane.remove(task)
            task.done([], RequestFailed(f"PoC forward failed: {e}").info())

    def _finish(self, is_job: bool, task: ArtifactTask, artifacts: list[tuple[int, str]], num_run: int) -> None:
        self.iterations.observe(num_run * task.job.spec.seq_len)
        self.is_blocked = False
        lane = self._queued(is_job, task)
        if lane is None:
            return
        self._num_job_forwards = self._num_job_forwards + 1 if is_job else 0
        self._restart_clock(task)  # progress: the next chunk's wait starts now
        task.artifacts.extend(Artifact(nonce=n, vector_b64=v) for n, v in artifacts)
        del task.remaining[:num_run]
        if not task.remaining:
            lane.remove(task)
            task.done(task.artifacts, None)
        elif is_job:
            lane.remove(task)  # round-robin: the next job's turn
            lane.append(task)

    def unblock(self) -> None:
        """An engine step ran: blocks may have been freed."""
        self.is_blocked = False
