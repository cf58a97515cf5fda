"""What the engine thread does next: a pure function of a frozen snapshot, tested as a decision table.

When chat and PoC work compete, chat keeps its share of the device (`share.py` keeps the account): PoC runs only
once its credit buys an efficient forward (pow/cost.py: at most a fifth of its time fixed overhead), and then as
many sequences as the credit buys. A chat request still being tokenized counts as chat: PoC does not start a long
forward just before it reaches the engine, and neither does chat that had work a moment ago (the loop's linger: a
client's next request is usually on its way). While every recent forward had one size, the next is of another
(twice or half, `_probe_size`): one size alone cannot tell fixed overhead from per-sequence time. With chat idle,
PoC runs forwards back to back, each at most IDLE_FORWARD_S long (a chat that arrives waits for the one in flight)
unless a shorter one would waste more than IDLE_MAX_OVERHEAD of its time, and whole ones while chat is gated (an
exclusive round); with nothing to run, the loop blocks on its inbox. That is `choose`, for time-slicing; where PoC
forwards run beside chat steps (--poc-overlap) the loop asks `choose_overlapped` instead.

Where the engine pipelines (`PocRunner.pipelines`: time-sliced, one pipeline stage, any TP), an exclusive round's
forwards are launched whole and back to back (`PocLaunch`: the next queued behind the one running, at most
--poc-forwards-in-flight) and collected oldest first (`PocCollect`), so the device never idles between them while the
engine thread reads one's artifacts and launches the next. Once the round is no longer gated, or a slot is not
free, the oldest is collected: a request let in then waits for the forwards in flight, as a job does.

Where the engine can park a forward between its decoder layers (one rank, time-sliced: `PocRunner.parks`), an idle
forward is started parked (`PocBatch(parked=True)`) and run a chunk of layers at a time (`PocChunk`): a request
that arrives meanwhile waits for one chunk, not a whole forward, and goes first; the forward goes on in the chunks
chat's share pays for (credit), or once chat is idle. Its size is then bound per layer (PARKED_WAIT_S), which is
what a new request waits for.

Chat comes in bursts after short gaps. While chat ran within CHAT_QUIET_S, an idle forward may spend up to
MAX_OVERHEAD_SHARE of its time on overhead to keep within its bound (the next burst is likely); after a longer
quiet (mining alone), only IDLE_MAX_OVERHEAD: the bound then gives way to efficiency.

The same holds beside chat (`choose_overlapped`): a forward launched while chat is idle takes every SM, so a
request arriving then waited for the whole of it and the next queued behind it. While chat is idle but ran within
CHAT_QUIET_S (not gated), a forward is launched paced (`Overlapped.paced`): queued only a few milliseconds ahead of
the GPU, and moved onto PoC's share of the SMs as soon as chat runs (backend/engine/pocworker/pacing.py). After a
longer quiet, forwards are launched whole again (CUDA graphs, no host time per layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.pow.cost import MAX_OVERHEAD_SHARE, Cost

# With chat idle but free to arrive: the longest a PoC forward should make a new request wait, and the overhead
# share that justifies a longer one. On a GPU the network's 32 x 1024 forward takes ~0.1 s on a 0.6B shape (one
# whole forward); on the CPU engine it takes seconds and is split.
IDLE_FORWARD_S = 0.25
IDLE_MAX_OVERHEAD = 0.05
# A parked forward's layer chunk: the longest a request arriving while chat was idle waits for PoC.
PARKED_WAIT_S = 0.03
# Chat that ran within this long is likely to come again soon (bursts after short gaps): idle forwards keep their
# bound at up to MAX_OVERHEAD_SHARE overhead (CPU engine: a 4-stream burst's TTFT p99 +88 ms during mining at the
# 5% floor, docs/benchmarks-history.md).
CHAT_QUIET_S = 30.0


@dataclass(frozen=True)
class Snapshot:
    # vLLM has unfinished requests (running, waiting or with a step in flight).
    has_engine_work: bool
    # Chat requests on their way to the engine (the processor is tokenizing them).
    is_chat_preparing: bool = False
    # Chat had work within the loop's linger (CHAT_LINGER_S): PoC is sized as if it still had.
    is_chat_recent: bool = False
    # Chat has had no work for CHAT_QUIET_S (or never): idle forwards are sized for efficiency, not for a burst.
    is_chat_quiet: bool = True
    # Chat is refused (an exclusive-mode round): no request can arrive for PoC to make room for.
    is_chat_gated: bool = False
    # PoC artifact work is queued (jobs or a round's batch).
    has_poc_work: bool = False
    # The last PoC forward found no free KV blocks: let an engine step free some first.
    is_poc_blocked: bool = False
    # Seconds of PoC the chat share allows now, while both compete.
    poc_credit_s: float = 0.0
    # What the next PoC forward costs, learned (None: none of its seq_len ran yet), and the most sequences it takes.
    poc_cost: Cost | None = None
    poc_max_batch: int = 0
    # A PoC forward launched beside chat steps is still running (forwards overlap chat; choose_overlapped), or one
    # is parked between layers (time-sliced; choose).
    is_poc_in_flight: bool = False
    # Another forward may be launched behind those in flight (a slot free, the newest wholly queued, a batch none
    # of them holds).
    has_poc_slot: bool = False
    # Chat's share setting (choose_overlapped reads only its ends, 0 and 1).
    chat_share: float = 0.5
    # The engine can park a forward between decoder layers (time-sliced, one rank), and how many layers it has.
    can_park_poc: bool = False
    poc_num_layers: int = 1
    # The engine launches an exclusive round's forwards back to back (time-sliced; PocRunner.pipelines), and the
    # forwards in flight were launched so.
    can_pipeline_poc: bool = False
    is_poc_pipelined: bool = False


@dataclass(frozen=True)
class EngineStep:
    """Run one vLLM engine step."""


@dataclass(frozen=True)
class PocBatch:
    """Run one PoC forward of the next artifact task on leased KV blocks."""

    # At most this many sequences; None: a whole forward (as many as the engine takes at once).
    limit: int | None = None
    # Started parked: its first chunk of layers runs now, the rest in PocChunk turns.
    parked: bool = False


@dataclass(frozen=True)
class PocChunk:
    """Run the next chunk of layers of the parked PoC forward (it finishes with its last layer)."""


@dataclass(frozen=True)
class PocLaunch:
    """Launch a whole PoC forward of the next task behind those in flight (pipelined, an exclusive round)."""


@dataclass(frozen=True)
class PocCollect:
    """Wait for the oldest pipelined PoC forward in flight and finish it."""


@dataclass(frozen=True)
class Idle:
    """Nothing to do: block on the inbox."""


Work = EngineStep | PocBatch | PocChunk | PocLaunch | PocCollect | Idle


def without_poc(has_engine_work: bool) -> EngineStep | Idle:
    """What choose() answers while PoC has no work and no forward in flight, without a Snapshot: the engine loop's
    path for chat alone, where building the snapshot and choosing took a fifth of the loop's own host time around
    a step on the CPU engine (0.03 of 0.17 ms; docs/benchmarks-history.md, 2026-12-07 (night)). tests/unit/
    test_policy.py holds it equal to choose() over every snapshot without PoC work."""
    return _STEP if has_engine_work else _IDLE


def overlapped_without_poc(has_engine_work: bool) -> Overlapped:
    """choose_overlapped's answer in the same case."""
    return _STEP_BESIDE if has_engine_work else _NOTHING_BESIDE


def choose(s: Snapshot) -> Work:
    chat = without_poc(s.has_engine_work)  # Idle while only preparing: wait for it to arrive
    if s.is_poc_in_flight:
        return _pipelined_forward(s) if s.is_poc_pipelined else _parked_forward(s, chat)
    poc_ready = s.has_poc_work and not (s.is_poc_blocked and s.has_engine_work)
    if not poc_ready:
        return chat
    if not (s.has_engine_work or s.is_chat_preparing):
        if s.is_chat_gated:
            return PocLaunch() if s.can_pipeline_poc else PocBatch()
        if not s.is_chat_recent:
            return _idle_forward(s)
        # Chat just went quiet: PoC spends what credit it has left, then waits out the linger.
    if s.poc_credit_s <= 0:
        return chat
    if s.poc_credit_s == float("inf"):
        return PocBatch()
    if s.poc_cost is None:
        return PocBatch(limit=1)  # one sequence first: its time starts the cost model
    affordable = s.poc_cost.sequences_within(s.poc_credit_s)
    if affordable < smallest_forward(s.poc_cost, s.poc_max_batch):
        return chat  # keep earning until the forward is worth its overhead (or is the probe)
    return PocBatch(limit=_probe_size(s.poc_cost, s.poc_max_batch) or affordable)


def _probe_size(cost: Cost, max_batch: int) -> int:
    """While every recent forward had one size, a forward of another size (twice it, or half where twice does not
    fit), so that the cost model can tell overhead from per-sequence time; 0 once it can. Until then a forward of
    one sequence looks efficient however much of it is overhead: at full depth (the 235B model, TP=2) one sequence
    took ~145 ms against ~50 ms a sequence in whole forwards, and shared mode kept PoC at a third of its rate."""
    n = cost.only_size
    if not n:
        return 0
    return 2 * n if 2 * n <= max_batch else n // 2


def smallest_forward(cost: Cost, max_batch: int) -> int:
    """The fewest sequences PoC waits to afford beside chat: an efficient forward (or the task's rest), or the
    probe. The share's credit cap is sized by this forward, so it can always be afforded."""
    return max(min(cost.efficient_size(), max_batch), _probe_size(cost, max_batch))


def _idle_forward(s: Snapshot) -> PocBatch:
    if s.poc_cost is None:
        return PocBatch(limit=1, parked=s.can_park_poc)
    # Parked, a new request waits for one layer chunk: the forward is bound per layer instead of whole.
    bound_s = PARKED_WAIT_S * s.poc_num_layers if s.can_park_poc else IDLE_FORWARD_S
    max_overhead = IDLE_MAX_OVERHEAD if s.is_chat_quiet else MAX_OVERHEAD_SHARE
    size = min(max(s.poc_cost.sequences_within(bound_s), s.poc_cost.efficient_size(max_overhead)), s.poc_max_batch)
    if size == s.poc_cost.only_size:
        size = _probe_size(s.poc_cost, s.poc_max_batch) or size
    return PocBatch(limit=None if size >= s.poc_max_batch else size, parked=s.can_park_poc)


def _pipelined_forward(s: Snapshot) -> Work:
    """Forwards launched back to back: one more behind them while the round is gated, nothing of chat's is on its
    way and a slot is free; otherwise the oldest is collected (chat's next step would queue behind them anyway)."""
    if s.is_chat_gated and not (s.has_engine_work or s.is_chat_preparing) and s.has_poc_slot:
        return PocLaunch()
    return PocCollect()


def _parked_forward(s: Snapshot, chat: Work) -> Work:
    """A forward parked between layers: its next chunk while chat is idle or gated, or while chat's share leaves
    PoC credit; otherwise chat first (a request being tokenized is waited for), the forward keeping its blocks."""
    if s.is_chat_gated or not (s.has_engine_work or s.is_chat_preparing) or s.poc_credit_s > 0:
        return PocChunk()
    return chat


@dataclass(frozen=True)
class Overlapped:
    """One loop turn where PoC forwards run beside chat steps on a stream of their own: start the next forward
    (the loop queues its layers between steps and collects it when done), and/or step the engine."""

    launch_poc: bool
    step_chat: bool
    # The forward launched is paced: chat is idle now, but likely to come back soon.
    paced: bool = False


def choose_overlapped(s: Snapshot) -> Overlapped:
    """Between the share's ends the share is not spent here: it sized the SM partition a forward beside chat runs
    on (backend/engine/pocworker/streams.py), so PoC keeps a forward running, and the next queued behind it, while
    it has work. Share 1: a forward starts only while chat is idle, and none behind it (chat joining it waits for
    one forward at most). Share 0: chat steps only while PoC is idle, or to free the KV blocks PoC waits for."""
    is_chat_active = s.has_engine_work or s.is_chat_preparing
    has_slot = s.has_poc_slot and (s.chat_share < 1.0 or s.is_chat_gated)
    poc_ready = (s.has_poc_work and (not s.is_poc_in_flight or has_slot)
                 and not (s.is_poc_blocked and s.has_engine_work))
    launch = poc_ready and (s.chat_share < 1.0 or s.is_chat_gated or not is_chat_active)
    poc_busy = s.is_poc_in_flight or launch or (s.has_poc_work and not s.is_poc_blocked)
    step = s.has_engine_work and (s.chat_share > 0.0 or not poc_busy)
    paced = launch and not (s.is_chat_recent or s.is_chat_gated or s.is_chat_quiet)
    return Overlapped(launch_poc=launch, step_chat=step, paced=paced)


_STEP, _IDLE = EngineStep(), Idle()
_STEP_BESIDE = Overlapped(launch_poc=False, step_chat=True)
_NOTHING_BESIDE = Overlapped(launch_poc=False, step_chat=False)
