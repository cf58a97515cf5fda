"""Captured PoC forwards: one CUDA graph per batch shape and stream, replayed for every later forward of that shape.

Why: the engine thread queued the 0.6B shape's eager forward in 11 ms p50 of host time with chat idle (up to 32 ms
p90), and in ~26 ms of 1.5 ms slices beside chat; a replay is one launch (0.8-1.0 ms p50 with the inputs), and
leaves no gaps between kernels. On an H100 (docs/benchmarks-history.md, 2026-11-26): PoC alone 328-339 → 353-356
nonces/s; beside 16 streaming chats at share 0.3, chat 0.80 → 0.85x its idle rate, PoC 0.71 → 0.76x its rate
alone and TPOT p99 1.56 → 1.05x idle, against the eager forward in the same lease. The graph runs the kernels of
the eager forward it was captured from (a `LayerwiseForward` queued whole), so its results are the same bit for bit.

How:
- A shape's first forward runs eager (it warms up cuBLAS's handle and workspace for the stream, Triton's compiled
  kernels and the MoE workspace); its second is captured on the stream it will replay on, then replayed.
- What changes between forwards is written in place before each replay, on the same stream: the inputs (generated
  straight into the graph's buffer), the Householder vectors, and the block table and slot map of the leased KV
  blocks. Only attention metadata known to read those two tensors as given (and nothing derived from them) is
  captured, `GRAPH_SAFE_METADATA`; any other backend keeps the eager forward.
- Every graph keeps what its kernels read alive (the prefill metadata, its buffers) and has its own MoE workspace
  (vLLM's grows by reallocating, which would leave a graph reading freed memory). Graphs share one memory pool:
  forwards run one after another, and a replay's output is read, or copied out on its stream, before the next
  forward is launched.
- A capture that fails turns graphs off for the process, with the reason (the eager forward goes on).
  POCSERVE_POC_GRAPHS=0 turns them off from the start.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from backend.engine import compat
from backend.engine.pocworker.forward import LayerwiseForward, block_tables, prefill

log = structlog.get_logger(__name__)

# Attention metadata whose kernels read the block table and slot map tensors the prefill built, and no tensor
# derived from them at build time (vLLM 0.26 vllm/v1/attention/backends/flash_attn.py build(): with fast_build there
# is no AOT schedule).
GRAPH_SAFE_METADATA = ("FlashAttentionMetadata",)
# Eager forwards of a shape before it is captured.
WARMUP_FORWARDS = 1
# Shapes captured at most (a round uses one or two; each graph holds its [B, L, H] input buffer).
MAX_GRAPHS = 8


def enabled() -> bool:
    """POCSERVE_POC_GRAPHS=0 keeps every PoC forward eager."""
    return os.environ.get("POCSERVE_POC_GRAPHS", "1") != "0"


class GraphUnsupported(Exception):
    """This model's forward cannot be captured safely."""


@dataclass
class Captured:
    """One captured forward and the buffers it reads and writes."""

    graph: Any  # torch.cuda.CUDAGraph
    x: torch.Tensor  # [B, L, H] inputs, written before each replay
    vectors: torch.Tensor  # [num_layers, H] Householder vectors in the model dtype
    # forward.py's Prefill: its device block tables and slot maps are rewritten for other blocks; the rest
    # (positions, query start locations, sequence lengths) must live as long as the graph, which holds addresses.
    metadata: Any
    block_ids: list[int]  # the blocks its tables hold now
    last_hidden: torch.Tensor | None = None  # [B, H] float32, written by each replay
    _poc_workspace: Any = None  # its MoE workspace (compat.own_workspace), alive as long as the graph

    def replay(self, tables: list[tuple[torch.Tensor, torch.Tensor]] | None, vectors: torch.Tensor) -> None:
        """Queues the forward on the current stream; `tables` (host, as block_tables builds them) when the leased
        blocks changed since the last replay."""
        if tables is not None:
            for pair, host_pair in zip(self.metadata.tables, tables, strict=True):
                for dst, src in zip(pair, host_pair, strict=True):
                    # Pinned + non_blocking: no wait for the device (torch keeps the pinned source alive).
                    dst.copy_(src.pin_memory() if dst.is_cuda else src, non_blocking=dst.is_cuda)
        if vectors is not self.vectors:
            self.vectors.copy_(vectors)
        self.graph.replay()


class GraphedForward:
    """A replayed forward, shaped like a fully queued LayerwiseForward."""

    is_queued = True

    def __init__(self, last_hidden: torch.Tensor) -> None:
        self.last_hidden = last_hidden  # the graph's buffer, until extension.py copies it out
        self.is_copied = False

    def advance(self, budget_s: float) -> bool:
        return True


class PocGraphs:
    """One worker's captured forwards, by key: (stream kind, num_seqs, seq_len); the stream is the forward's
    stream, its kind part of the key since a graph replays on the stream it was captured on."""

    def __init__(self) -> None:
        self._captured: dict[tuple, Captured] = {}
        self._eager: Counter = Counter()
        self._pool: Any = None
        self.off_reason: str | None = None

    def launch(self, key: tuple, worker, block_ids: list[int], fill_inputs,
               vectors: torch.Tensor) -> GraphedForward | None:
        """Queues the forward of `key` on the current stream from its graph, capturing it first if this shape has
        had its eager warm-up; None where it runs eager instead: graphs off, a warm-up, or MAX_GRAPHS shapes taken.
        `fill_inputs(out)` writes the [B, L, H] inputs into `out`; `vectors` are the per-layer vectors."""
        if self.off_reason is not None:
            return None
        _, num_seqs, seq_len = key
        captured = self._captured.get(key)
        if captured is None:
            if self._eager[key] < WARMUP_FORWARDS or len(self._captured) >= MAX_GRAPHS:
                self._eager[key] += 1
                return None
            try:
                captured = self._capture(worker, block_ids, num_seqs, seq_len, fill_inputs, vectors)
            except Exception as e:  # the whole reason: an out-of-memory one ends with what torch held and reserved
                self.off_reason = f"{type(e).__name__}: {e}"[:1000]
                log.warning("poc_graphs_off", reason=self.off_reason)
                return None
            self._captured[key] = captured
            log.info("poc_graph_captured", kind=key[0], num_seqs=num_seqs, seq_len=seq_len,
                     graphs=len(self._captured))
            captured.replay(None, captured.vectors)
        else:
            fill_inputs(captured.x)
            tables = None
            if block_ids != captured.block_ids:
                tables = block_tables(worker.model_runner, worker.vllm_config, block_ids, num_seqs, seq_len)
                captured.block_ids = list(block_ids)
            captured.replay(tables, vectors)
        assert captured.last_hidden is not None
        return GraphedForward(captured.last_hidden)

    def _capture(self, worker, block_ids: list[int], num_seqs: int, seq_len: int, fill_inputs,
                 vectors: torch.Tensor) -> Captured:
        """Captures the forward on the current stream (nothing runs yet) with the inputs already in its buffers."""
        if torch.cuda.current_stream() == torch.cuda.default_stream():
            # Checked first: torch's capture_begin raises on it only after it has marked the RNG as capturing,
            # and every later sampling step then fails ("Offset increment outside graph capture").
            raise GraphUnsupported("a forward cannot be captured on the default stream")
        mr, cfg = worker.model_runner, worker.vllm_config
        metadata = prefill(mr, cfg, block_ids, num_seqs, seq_len)
        check_capturable(metadata)
        hidden_size = int(cfg.model_config.get_hidden_size())
        x = torch.empty((num_seqs, seq_len, hidden_size), dtype=cfg.model_config.dtype, device=mr.device)
        fill_inputs(x)
        forward = LayerwiseForward(mr, cfg, mr.get_model(), block_ids, x, vectors.clone(), metadata)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        captured = Captured(graph, x, forward._vectors, metadata, list(block_ids))
        # The pool comes out of memory free on the device, never out of the blocks torch's allocator caches: those
        # hold what vLLM's profile reserved for chat's activations. Emptying the cache first let the 235B slice's
        # graphs capture on an H100, and an eager forward of the same size then ran out of memory beside them
        # (2026-12-06, docs/decisions.md): a capture that does not fit turns graphs off instead.
        # thread_local: only this thread's calls are checked (the engine thread queues nothing else meanwhile).
        with compat.own_workspace(captured):
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                forward.advance(float("inf"))
            finally:
                graph.capture_end()
        assert forward.last_hidden is not None
        captured.last_hidden = forward.last_hidden
        return captured


def check_capturable(metadata) -> None:
    """Raises GraphUnsupported unless every layer's attention metadata reads the prefill's own block table and
    slot map tensors (the ones a replay rewrites) and holds no schedule computed from them."""
    tables = {id(t) for pair in metadata.tables for t in pair}
    for built in metadata.built:
        name = type(built).__name__
        if name not in GRAPH_SAFE_METADATA:
            raise GraphUnsupported(f"attention metadata {name} is not known to be safe to capture")
        if (id(built.block_table) not in tables or id(built.slot_mapping) not in tables
                or getattr(built, "scheduler_metadata", None) is not None):
            raise GraphUnsupported(f"{name} holds tensors other than the prefill's block table and slot map")
