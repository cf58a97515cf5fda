"""PoC artifact batches between engine steps: KV blocks leased from vLLM's pool, the forward in the workers.

Engine thread only. Blocks come from the scheduler's own BlockPool, so they are disjoint from every running
request's blocks and never the null block 0. They stay leased from one forward to the next, since taking and returning
vLLM's blocks one by one is host time during which the device idles (2048 blocks, B=32 × seq_len 1024 at block
size 16: ~0.7 ms a forward), and they go back to the pool before every engine step (Engine.step) and whenever
the loop has nothing to run (BackendLoop).
Every rank runs the forward (collective_rpc answers one result per rank, in rank order); only the last pipeline
stage has the artifacts, so the first answer that is not None is taken: the first TP rank of the last stage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import structlog
from vllm import envs as vllm_envs

from backend.engine import compat
from common.config import SettingsError
from poc.errors import PocInputError
from poc.spec import ArtifactJob, ForwardBatch

log = structlog.get_logger(__name__)


class NoFreeBlocks(Exception):
    """Not even one sequence fits in the free KV blocks now; retry after an engine step frees some."""


@dataclass(frozen=True)
class Flight:
    """A forward launched beside chat, until it is polled back: whose it is (the caller's token) and its size."""

    owner: Any  # the caller's
    num_nonces: int
    pipelined: bool = False  # launched whole on chat's stream, time-sliced (PocRunner.pipelines)


class ForwardsLost(Exception):
    """A poll failed and the workers dropped every forward in flight: these, oldest first (the first is the one
    that failed; the others never ran to the end)."""

    def __init__(self, flights: list[Flight], cause: Exception) -> None:
        super().__init__(str(cause))  # the failure's own words: the task that failed is answered with them
        self.flights = flights


class PocRunner:
    def __init__(self, core, max_num_seqs: int, max_batch_tokens: int) -> None:
        self._core = core
        self._pool = compat.block_pool(core)
        self.block_size = compat.block_size(core)
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.max_model_len = int(core.vllm_config.model_config.max_model_len)
        self.hidden_size = int(core.collective_rpc("poc_hidden_size")[0])
        self.layer_ranges = _layer_ranges(core.collective_rpc("poc_layer_range"), core.vllm_config)
        _check_kv_layout(core.collective_rpc("poc_kv_layout_problem"), core.vllm_config)
        self._held: list = []  # KVCacheBlocks leased for PoC forwards, kept between them (see release)
        self._held_ids: list[int] = []
        # The forwards launched beside chat and not yet collected, oldest first: the engine thread's only record of
        # them (the artifact queue keeps none).
        self._in_flight: deque[Flight] = deque()
        # Whether the newest forward launched is wholly queued in the workers (the next may be launched behind it).
        self._is_queued = True
        # Whether launched forwards run beside chat's steps (a stream of their own); set by the engine at start.
        self.overlaps = False
        # Forwards launched at once (--poc-forwards-in-flight); set by the engine at start. With one, the device
        # waits between forwards while the engine thread notices the end, reads the artifacts and launches the next.
        self.max_in_flight = 2
        # Whether a time-sliced engine may park a launched forward between decoder layers (backend/core/policy.py): one
        # rank only, since each rank's worker cuts its chunks by its own clock and ranks must run the same layers
        # between their collectives. Set by the engine at start.
        self.parks = False
        # Whether a time-sliced engine launches an exclusive round's forwards back to back (`launch(pipelined=True)`):
        # the next queued behind the one running and each one's artifacts computed while the next runs, instead of
        # `run`'s forward, sync and artifacts with the device idle between them. One pipeline stage (any number of TP
        # ranks: every rank launches the same forwards in the same order). Set by the engine at start.
        self.pipelines = False
        self.num_forwards = 0  # forwards started (run or launched): the heap profile puts growth per forward

    @property
    def num_own_layers(self) -> int:
        """Decoder layers of the rank that holds the most: a parked forward takes at least that many chunks."""
        return max(end - start for start, end in self.layer_ranges)

    def check(self, job: ArtifactJob) -> None:
        """Raises PocInputError naming the field for a job this engine cannot run."""
        spec = job.spec
        if not job.nonces:
            raise PocInputError("nonces", "nonces must not be empty")
        if not 0 < spec.k_dim <= self.hidden_size:
            raise PocInputError("k_dim", f"k_dim must be in [1, {self.hidden_size}], got {spec.k_dim}")
        limit = min(self.max_model_len, self.max_batch_tokens)
        if not 0 < spec.seq_len <= limit:
            raise PocInputError("seq_len", f"seq_len must be in [1, {limit}] on this engine, got {spec.seq_len}")
        if self.blocks_per_seq(spec.seq_len) > self._pool.num_gpu_blocks - 1:
            raise PocInputError("seq_len", f"seq_len {spec.seq_len} needs more KV blocks than the engine has")

    def blocks_per_seq(self, seq_len: int) -> int:
        return -(-seq_len // self.block_size)

    def max_batch(self, seq_len: int) -> int:
        """Sequences per forward: ≤ max_num_seqs (the attention metadata builders size for it) and ≤
        max_batch_tokens, itself ≤ the engine's max_num_batched_tokens: vLLM's profile, its kernels' shared
        workspace (fused MoE's above all: locked after warm-up, and captured CUDA graphs hold its address) and
        the activation memory left beside the KV cache are all sized for that many tokens."""
        return max(1, min(self.max_num_seqs, self.max_batch_tokens // seq_len))

    def run(self, job: ArtifactJob, nonces: list[int]) -> tuple[list[tuple[int, str]], int]:
        """One forward over `nonces` (already ≤ max_batch); shrinks to what the free blocks allow.

        Returns (artifacts, number of nonces run): the run ones are a prefix of `nonces`; NaN rows are
        missing from the artifacts (poc/artifacts.py drops every row that is not finite) but still count as
        run."""
        batch = self._lease_for(job, nonces)
        self.num_forwards += 1
        results = self._call("poc_artifacts", batch)
        return _artifacts(next(r for r in results if r is not None)), len(batch.nonces)

    def launch(self, job: ArtifactJob, nonces: list[int], is_chat_running: bool, budget_s: float,
               owner: Any = None, paced: bool = False, pipelined: bool = False) -> int:
        """Starts one forward over a prefix of `nonces` (as `run`) beside chat's steps and returns how many it
        took: the workers queue its first decoder layers in `budget_s` of host time, `poll` the rest and then
        collects it, handing back `owner` with its artifacts. Its blocks stay leased until then, whatever
        `release` is asked. Beside running chat the forward takes only PoC's share of the device
        (backend/engine/pocworker/streams.py); `paced`, launched with chat idle, it runs on every SM no further
        ahead of the GPU than a request may wait for, until chat runs (backend/engine/pocworker/pacing.py). While
        `can_launch`, a second may be launched behind the first: it runs after it, so the device never waits for
        the engine thread to collect one forward and launch the next. `pipelined` (time-sliced, `pipelines`): the
        forward goes on chat's stream, queued whole; forwards in flight are then all pipelined ones."""
        assert self.can_launch, f"{len(self._in_flight)} PoC forwards in flight, the newest not wholly queued"
        assert not self._in_flight or self._in_flight[0].pipelined == pipelined, "pipelined and other forwards mixed"
        batch = self._lease_for(job, nonces)
        self.num_forwards += 1
        results = self._call("poc_launch", batch, is_chat_running, budget_s, paced, pipelined)
        self._in_flight.append(Flight(owner, len(batch.nonces), pipelined))
        self._is_queued = all(results)
        return len(batch.nonces)

    def poll(self, wait: bool = False, budget_s: float = float("inf"),
             is_chat_running: bool = False) -> tuple[Flight, list[tuple[int, str]]] | None:
        """Queues more of the newest forward launched (for `budget_s`; a paced one moves onto PoC's SMs once
        `is_chat_running`), then (the oldest one, its artifacts) once it has finished (queueing all and blocking
        if `wait`), None before. A failure drops every forward in flight, as the workers drop theirs: ForwardsLost
        names them."""
        assert self._in_flight, "no PoC forward in flight"
        try:
            results = self._call("poc_poll", wait, budget_s, is_chat_running)
        except Exception as e:
            raise ForwardsLost(self._drop_in_flight(), e) from e
        except BaseException:
            self._drop_in_flight()
            raise
        self._is_queued = all(is_queued for _, _, is_queued in results)
        if not all(finished for finished, _, _ in results):
            return None
        return self._in_flight.popleft(), _artifacts(next(a for _, a, _ in results if a is not None))

    def _call(self, method: str, *args) -> list:
        """The workers' `method` on every rank, one answer each in rank order. vLLM's own bound on a model step
        applies: a rank that never answers (a worker node gone) fails the engine, which exits for its
        supervisor, instead of hanging the engine thread. A failure returns the leased blocks, unless forwards
        the workers still hold are in flight."""
        try:
            return self._core.collective_rpc(method, timeout=vllm_envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, args=args)
        except BaseException:
            self.release()
            raise

    def _drop_in_flight(self) -> list[Flight]:
        dropped = list(self._in_flight)
        self._in_flight.clear()
        self._is_queued = True
        self.release()
        return dropped

    @property
    def is_in_flight(self) -> bool:
        return bool(self._in_flight)

    @property
    def is_pipelined(self) -> bool:
        """The forwards in flight were launched pipelined (an exclusive round's, time-sliced)."""
        return bool(self._in_flight) and self._in_flight[0].pipelined

    @property
    def can_launch(self) -> bool:
        """Another forward may be launched now: fewer than max_in_flight are, and the newest is wholly queued."""
        return len(self._in_flight) < self.max_in_flight and self._is_queued

    def _lease_for(self, job: ArtifactJob, nonces: list[int]) -> ForwardBatch:
        """The forward of the prefix of `nonces` the free blocks allow, on leased blocks; NoFreeBlocks if none
        fits."""
        per_seq = self.blocks_per_seq(job.spec.seq_len)
        available = self._pool.get_num_free_blocks() + len(self._held)
        fits = available // per_seq
        if fits == 0:
            raise NoFreeBlocks(f"{per_seq} blocks needed, {available} free")
        nonces = nonces[:fits]
        return ForwardBatch(job.spec, tuple(nonces), tuple(self._lease(len(nonces) * per_seq)))

    def _lease(self, num_blocks: int) -> list[int]:
        """Ids of `num_blocks` leased blocks: the held ones, more leased where they are too few. Every forward
        uses a prefix of them: its KV writes land after the previous forward has finished (the workers run them
        one after another), so reuse is safe."""
        if len(self._held) < num_blocks:
            more = self._pool.get_new_blocks(num_blocks - len(self._held))
            self._held += more
            self._held_ids += [b.block_id for b in more]
            assert 0 not in self._held_ids, "the null block must never be leased"
        return self._held_ids[:num_blocks]

    def release(self) -> None:
        """Returns the held blocks to vLLM's pool (the scheduler must see them before it schedules a step); not
        while a launched forward may still write them."""
        if self._held and not self._in_flight:
            self._pool.free_blocks(self._held)
            self._held, self._held_ids = [], []


def _layer_ranges(ranges: list[tuple[int, int] | None], vllm_config) -> list[tuple[int, int]]:
    """Each rank's [start, end) decoder layers; SettingsError (a start error) if the model has no layer list."""
    if any(r is None for r in ranges):
        archs = ", ".join(vllm_config.model_config.architectures or ["?"])
        raise SettingsError(f"--model / POCSERVE_MODEL: {archs} has no decoder layer list (model.model.layers, "
                            "model.transformer.h or model.layers), so PoC cannot apply its per-layer transforms")
    return [(int(r[0]), int(r[1])) for r in ranges if r is not None]


def _check_kv_layout(problems: list[str | None], vllm_config) -> None:
    """SettingsError (a start error) where a rank's KV cache has a group PoC's prefill cannot be laid out on."""
    problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        archs = ", ".join(vllm_config.model_config.architectures or ["?"])
        raise SettingsError(f"--model / POCSERVE_MODEL: {archs}: {problem}, so PoC cannot lay its prefill out "
                            "on the leased KV blocks")


def _artifacts(rows) -> list[tuple[int, str]]:
    """The workers' (nonce, vector_b64) rows as plain Python values (they arrive through pickling as whatever
    the last stage sent)."""
    return [(int(n), str(v)) for n, v in rows]
