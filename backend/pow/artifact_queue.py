"""Queued PoC artifact jobs, run one forward at a time by the engine thread between engine steps."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from backend.engine.poc import NoFreeBlocks
from backend.errors import RequestFailed
from backend.iterations import IterationHistogram
from poc.spec import ArtifactJob
from protocol.common import ErrorInfo
from protocol.poc import Artifact

log = structlog.get_logger(__name__)


@dataclass
class ArtifactTask:
    job: ArtifactJob
    # Called once with (artifacts, None) or ([], error).
    done: Callable[[list[Artifact], ErrorInfo | None], None]
    # What submitted it ("mining", "job", "direct"): lets /stop discard a round's batches.
    tag: str = "direct"
    remaining: list[int] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.remaining = list(self.job.nonces)


class ArtifactQueue:
    """FIFO of artifact jobs; `run_batch` runs one forward of the oldest and finishes it when done."""

    def __init__(self, runner) -> None:
        self._runner = runner
        self._tasks: deque[ArtifactTask] = deque()
        self.is_blocked = False
        # One observation (tokens = nonces × seq_len) per forward: PoC work moves vllm:iteration_tokens_total too.
        self.iterations = IterationHistogram()

    def __len__(self) -> int:
        return len(self._tasks)

    def check(self, job: ArtifactJob) -> None:
        """Raises PocInputError (naming the field) for a job this engine cannot run."""
        self._runner.check(job)

    def max_batch(self, seq_len: int) -> int:
        """Nonces one forward takes at `seq_len` (a task with more runs as several forwards)."""
        return self._runner.max_batch(seq_len)

    def submit(self, task: ArtifactTask) -> None:
        self._runner.check(task.job)
        self._tasks.append(task)

    def discard(self, predicate) -> int:
        """Drops queued tasks matching `predicate` without calling them back; returns how many."""
        kept = deque(t for t in self._tasks if not predicate(t))
        num = len(self._tasks) - len(kept)
        self._tasks = kept
        return num

    def run_batch(self) -> None:
        task = self._tasks[0]
        batch = task.remaining[: self._runner.max_batch(task.job.spec.seq_len)]
        try:
            artifacts, num_run = self._runner.run(task.job, batch)
        except NoFreeBlocks as e:
            # Running requests hold the KV cache: let engine steps finish some before trying again.
            self.is_blocked = True
            log.debug("poc_batch_waits_for_blocks", reason=str(e))
            return
        except Exception as e:  # one job failed in the worker; the engine may still be fine
            log.exception("poc_batch_failed", num_nonces=len(batch))
            self._tasks.popleft()
            task.done([], RequestFailed(f"PoC forward failed: {e}").info())
            return
        self.is_blocked = False
        self.iterations.observe(num_run * task.job.spec.seq_len)
        task.artifacts.extend(Artifact(nonce=n, vector_b64=v) for n, v in artifacts)
        del task.remaining[:num_run]
        if not task.remaining:
            self._tasks.popleft()
            task.done(task.artifacts, None)

    def unblock(self) -> None:
        """An engine step ran: blocks may have been freed."""
        self.is_blocked = False
