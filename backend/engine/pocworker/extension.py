"""The worker-side PoC forward: methods vLLM mixes into its Worker, which the engine thread calls by name.

Installed through backend/engine/worker_extension.py's WorkerExtension (the one class vLLM is given), so `self` is the
Worker (model_runner, device, vllm_config). Every rank runs the same method with the same arguments. Every TP rank
of the first pipeline stage regenerates the inputs itself; later stages receive the previous stage's hidden states,
as in a chat step (forward.py). Each stage reflects only the decoder layers it holds, with their global layer
indices (hooks.py), and only the last stage returns artifacts.

Invariants (each one cost someone invalid votes on the network):
- attention metadata is built fresh for every forward (a cached one produced all-NaN hidden states);
- inputs come from a fresh buffer, never a view into KV-cache memory;
- KV writes go only to blocks the engine thread leased for this forward (never the null block 0);
- the eager model path (`skip_compiled=True`) runs, so the layer hooks fire and no compiled graph is reused;
- reflection hooks exist only for the duration of the PoC forward.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from backend.engine import compat
from backend.engine.pocworker import forward, graphs, pacing, streams
from backend.engine.pocworker.hooks import decoder_layers, find_layers, own_layers, reflection_hooks
from poc.artifacts import compute_artifacts
from poc.rng import householder_vectors, input_embeddings
from poc.spec import ForwardBatch, PocSpec

log = structlog.get_logger(__name__)


@torch.inference_mode()
def warm_up_poc_kernels(hidden_size: int, dtype: torch.dtype, device: torch.device) -> dict[str, float]:
    """Runs each of PoC's Triton kernels (poc/cuda_kernels.py) once on one 16-token sequence of this hidden size
    and dtype; returns how many Triton built. Triton specialises integer arguments on being 1 or a multiple of 16:
    with a hidden size and a round's seq_len multiples of 16 (the network's 1024), a row's L·H, its half, an eighth
    of it for the stronger RNG's segments and their sixteenth, and the B·L rows all are, for any batch, as they are
    here. So these are a round's builds; a round of another class builds its own at its first forward, as before."""
    from backend.engine.warmup import counting_triton_builds
    from poc.cuda_kernels import available, reflect_add_rms_norm, reflect_pair
    from poc.rng import standard_inputs, stronger_inputs
    started = time.perf_counter()
    if not available(torch.empty(0, device=device)):  # not CUDA, or POCSERVE_POC_TRITON=0: torch ops, no builds
        return {"triton_builds": 0, "elapsed_s": 0.0}
    builds, restore = counting_triton_builds()
    try:
        x = standard_inputs([0], 16, hidden_size, device, dtype).view(16, hidden_size)
        stronger_inputs([list(range(8))], 16, hidden_size, device, dtype)
        v = torch.nn.functional.normalize(x[0].float(), dim=0).to(dtype)
        reflect_pair(x, x, v)  # one tensor: transforms.reflect's launch
        h, r = reflect_pair(x, x.flip(0).contiguous(), v)
        reflect_add_rms_norm(h, r, v, torch.ones_like(v), 1e-6)
        torch.cuda.synchronize(device)
    finally:
        restore()
    return {"triton_builds": builds(), "elapsed_s": time.perf_counter() - started}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class PocWorkerExtension:
    """Methods mixed into vLLM's Worker; called through collective_rpc by name."""

    # The Worker's, once vLLM mixes this class in.
    model_runner: Any
    vllm_config: Any
    device: Any
    # Set by poc_prepare_overlap on CUDA: the streams launched forwards run on (streams.py).
    _poc_streams: Any = None
    # Set with the streams unless POCSERVE_POC_GRAPHS=0: the captured forwards (graphs.py).
    _poc_graphs: graphs.PocGraphs | None = None
    # Set with the streams: how far forwards launched paced run ahead (pacing.py).
    _poc_pacer: pacing.Pacer | None = None
    # Set by poc_prepare_pipeline on CUDA without the streams: where a pipelined forward's artifacts are computed.
    _poc_collect: Any = None

    @property
    def _poc_in_flight(self) -> deque[_InFlight]:
        """Forwards launched and not yet collected by poc_poll, oldest first (the engine keeps at most two)."""
        flights = self.__dict__.get("_poc_flights")
        if flights is None:
            flights = self.__dict__["_poc_flights"] = deque()
        return flights

    def _householder(self, block_hash: str, num_layers: int, hidden_size: int, device) -> torch.Tensor:
        """The round's per-layer vectors, cached: they depend only on the block hash (poc/seeds.py)."""
        key = (block_hash, num_layers, hidden_size, str(device))
        cached = getattr(self, "_poc_householder", None)
        if cached is None or cached[0] != key:
            cached = (key, householder_vectors(block_hash, num_layers, hidden_size, device))
            self._poc_householder = cached
        return cached[1]

    def poc_hidden_size(self) -> int:
        return int(self.model_runner.model_config.get_hidden_size())

    def poc_layer_range(self) -> tuple[int, int] | None:
        """[start, end) global indices of the decoder layers this rank holds; None if the model has no decoder
        layer list (the engine refuses to start then: PoC could not reflect anything)."""
        model = self.model_runner.get_model()
        if find_layers(model) is None:
            return None
        layers = own_layers(model)
        return layers.start, layers.stop

    def poc_kv_layout_problem(self) -> str | None:
        """Why PoC cannot lay a prefill out on this rank's KV cache (forward.layout_problem), None if it can (the
        engine refuses to start otherwise)."""
        return forward.layout_problem(self.model_runner, self.vllm_config)

    def _poc_last_hidden(self, device, batch: ForwardBatch) -> torch.Tensor | None:
        """The batched prefill with the round's reflections, queued on the current stream: the last position's
        hidden state [B, H] on the last pipeline stage, None on the others."""
        model = self.model_runner.get_model()
        # Only the first pipeline stage makes the inputs; later ones receive the previous stage's hidden states.
        x = self._poc_embeddings(device, batch) if forward.is_first_stage() else None
        vectors = self._poc_vectors(device, batch.spec.block_hash)
        with reflection_hooks(model, vectors):
            return forward.pipeline_last_hidden(self.model_runner, self.vllm_config, model, list(batch.block_ids),
                                                len(batch.nonces), batch.spec.seq_len, x)

    def _poc_embeddings(self, device, batch: ForwardBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        """The seeded input embeddings [B, L, H], queued on the current stream."""
        cfg, spec = self.vllm_config, batch.spec
        return input_embeddings(spec.block_hash, spec.public_key, list(batch.nonces), spec.seq_len,
                                int(cfg.model_config.get_hidden_size()), device, cfg.model_config.dtype,
                                stronger_rng=spec.stronger_rng, out=out)

    def _poc_vectors(self, device, block_hash: str) -> torch.Tensor:
        cfg = self.vllm_config
        num_layers = len(decoder_layers(self.model_runner.get_model()))
        # reflect() casts v to the activation dtype anyway; casting once here saves two copies per layer.
        vectors = self._householder(block_hash, num_layers, int(cfg.model_config.get_hidden_size()), device)
        return vectors.to(cfg.model_config.dtype)

    def _device(self) -> torch.device:
        return torch.device(self.device) if not isinstance(self.device, torch.device) else self.device

    @torch.inference_mode()
    def poc_artifacts(self, batch: ForwardBatch) -> list[tuple[int, str]] | None:
        """One batched causal prefill of the seeded inputs; returns (nonce, vector_b64) for finite rows on the
        last pipeline stage, None on the others."""
        device = self._device()
        _sync(device)  # the previous engine step may still be running on this stream
        hidden = self._poc_last_hidden(device, batch)
        if hidden is None:
            return None
        return _artifacts(hidden, batch)

    def poc_warm_up_kernels(self) -> dict[str, float]:
        """PoC's Triton kernels built at start (warm_up_poc_kernels), so that a round's first forward compiles none."""
        cfg = self.vllm_config
        return warm_up_poc_kernels(int(cfg.model_config.get_hidden_size()), cfg.model_config.dtype, self._device())

    # --- PoC beside chat: the forward queued on a low-priority stream while chat steps go on (backend/engine/poc.py)

    def poc_prepare_overlap(self, chat_share: float) -> dict | None:
        """Sets up the streams of forwards launched beside chat (streams.py) and says what it made; None off
        CUDA (a forward then runs when it is launched, as poc_artifacts)."""
        device = self._device()
        if device.type != "cuda":
            return None
        self._poc_streams = streams.prepare(device, chat_share)
        self._poc_pacer = pacing.Pacer(lambda: torch.cuda.Event(enable_timing=True))
        if graphs.enabled():
            self._poc_graphs = graphs.PocGraphs()
        return {**self._poc_streams.description, "graphs": graphs.enabled()}

    def poc_prepare_pipeline(self) -> bool:
        """Time-sliced (no PoC streams): a forward launched `pipelined` is queued on chat's own stream behind the
        one running, with no sync between them, and its artifacts are computed on a side stream while the next
        runs, so the device never waits for the engine thread between an exclusive round's forwards. Makes that
        side stream; False off CUDA (a forward runs there as it is launched)."""
        device = self._device()
        if device.type != "cuda":
            return False
        if self._poc_collect is None:
            self._poc_collect = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1])
        return True

    @torch.inference_mode()
    def poc_launch(self, batch: ForwardBatch, is_chat_running: bool, budget_s: float, paced: bool = False,
                   pipelined: bool = False) -> bool:
        """Starts queueing one forward (poc_artifacts'): as many decoder layers as `budget_s` of host
        time allows, the rest in poc_poll calls, which also collect it. Beside running chat it takes only PoC's
        share of the SMs (streams.py); a shape's forwards after its first are replayed from a CUDA graph where
        one can be made (graphs.py). `paced` (chat idle, but likely to come): eager layers on every SM, never more
        than pacing.AHEAD_S ahead of the GPU, and moved onto PoC's SMs once chat runs (pacing.py). `pipelined`
        (time-sliced, see poc_prepare_pipeline): on chat's stream, after whatever is queued there. It may be
        launched while the previous forward runs, once that one is wholly queued: it runs after it, on the same
        blocks. Returns whether it is wholly queued."""
        if self._poc_in_flight and not self._poc_in_flight[-1].forward.is_queued:
            raise RuntimeError("the PoC forward in flight is not wholly queued yet")
        if not forward.is_first_stage():
            raise RuntimeError("PoC forwards launched ahead run on one pipeline stage only")
        device = self._device()
        if self._poc_streams is not None:
            stream, carveout = self._poc_streams.for_launch(is_chat_running)
        elif pipelined and self._poc_collect is not None:
            stream, carveout = torch.cuda.current_stream(device), 0
        else:
            stream, carveout = None, 0
        previous = self._poc_in_flight[-1] if self._poc_in_flight else None
        if stream is None:
            _sync(device)
        else:
            if previous is not None:
                self._keep_output(previous)
                # It runs on the previous one's blocks and may share its graph memory pool: after it, whatever
                # streams they run on.
                if previous.stream is not stream:
                    stream.wait_stream(previous.stream)
            # The leased KV blocks may have been a finished request's, still written by the chat steps queued so
            # far (async scheduling runs one step ahead): the forward starts after them.
            stream.wait_stream(torch.cuda.current_stream(device))
        block_ids = list(batch.block_ids)
        paced = (paced and stream is not None and not is_chat_running and self._poc_pacer is not None
                 and self._poc_pacer.is_worth_pacing(_shape(batch), len(own_layers(self.model_runner.get_model()))))
        with self._on_poc_stream(stream, carveout):
            vectors = self._poc_vectors(device, batch.spec.block_hash)

            def fill_inputs(out: torch.Tensor | None = None) -> torch.Tensor:
                return self._poc_embeddings(device, batch, out)

            fwd: Any = None
            if self._poc_graphs is not None and not paced:
                # A graph replays on the stream (and SMs) it was captured on.
                key = ("alone" if stream is self._poc_streams.alone else "beside", *_shape(batch))
                fwd = self._poc_graphs.launch(key, self, block_ids, fill_inputs, vectors)
            if fwd is None:
                fwd = forward.LayerwiseForward(self.model_runner, self.vllm_config, self.model_runner.get_model(),
                                               block_ids, fill_inputs(), vectors)
        f = _InFlight(fwd, stream, carveout, batch, paced=paced)
        self._poc_in_flight.append(f)
        return self._poc_advance(f, budget_s)

    @torch.inference_mode()
    def poc_poll(self, wait: bool, budget_s: float,
                 is_chat_running: bool = False) -> tuple[bool, list[tuple[int, str]] | None, bool]:
        """Queues more of the newest forward launched (up to `budget_s` of host time; all of it if `wait`; a paced
        one as far as its pacing allows, and on PoC's SMs from now if chat runs), then (finished, the oldest one's
        artifacts once it has finished, whether the newest is wholly queued); with `wait`, blocks until the oldest
        has finished. A failure drops every forward in flight."""
        if not self._poc_in_flight:
            raise RuntimeError("no PoC forward in flight")
        try:
            newest = self._poc_in_flight[-1]
            to_beside = newest.paced and is_chat_running and not wait
            if newest.paced and (wait or to_beside):
                self._unpace(newest, to_beside)
            # Moved beside chat, it waits a turn: chat's first step is queued before any more of it, so the request
            # waits only for what was ahead.
            is_queued = newest.forward.is_queued if to_beside else self._poc_advance(
                newest, float("inf") if wait else budget_s)
            f = self._poc_in_flight[0]
            if not f.forward.is_queued or (f.done is not None and not wait and not f.done.query()):
                return False, None, is_queued
            self._poc_in_flight.popleft()
            assert f.forward.last_hidden is not None
            with self._collecting(f):
                artifacts = _artifacts(f.forward.last_hidden, f.batch)
            return True, artifacts, is_queued
        except BaseException:
            self._poc_in_flight.clear()  # the engine thread fails the oldest's task and runs the others again
            if self._poc_pacer is not None:
                self._poc_pacer.clear()
            raise

    def _poc_advance(self, f: _InFlight, budget_s: float) -> bool:
        """Queues layers of forward `f` for `budget_s`; True once all are queued (its event recorded). A failure
        drops it."""
        if not f.forward.is_queued:
            try:
                with self._on_poc_stream(f.stream, f.carveout):
                    if not (self._advance_paced(f) if f.paced else f.forward.advance(budget_s)):
                        return False
            except BaseException:
                self._poc_in_flight.remove(f)  # the engine thread fails its task
                raise
        # Also for a forward queued whole at launch (a graph replay): without the event, poc_poll would read its
        # artifacts at once, the engine thread blocking in their copy until the forward ends.
        if f.stream is not None and f.done is None:
            f.done = torch.cuda.Event()
            f.done.record(f.stream)
        return True

    def _advance_paced(self, f: _InFlight) -> bool:
        """Queues the layers of paced forward `f` its pacing allows now; True once all are queued."""
        pacer = self._poc_pacer
        assert pacer is not None
        shape = _shape(f.batch)
        is_queued = False
        # One layer per event: each layer that ends makes room for the next while the others still run (an event
        # per chunk left the GPU dry from a chunk's end until the engine thread noticed it).
        for _ in range(pacer.layers_to_queue(shape)):
            before = f.forward.layers_left
            is_queued = f.forward.advance(float("inf"), max_layers=1)
            pacer.queued(shape, before - f.forward.layers_left, f.stream)
            if is_queued:
                break
        if is_queued:
            layer_s = pacer.layer_s.get(shape)
            log.debug("poc_paced", layer_ms=None if layer_s is None else round(layer_s * 1000, 3),
                      dry=pacer.num_dry)
        return is_queued

    def _unpace(self, f: _InFlight, to_beside: bool) -> None:
        """Paced forward `f` is queued as any other from now: its remaining layers beside chat, on PoC's SMs, if
        `to_beside` (after its layers queued so far, whose activations they read)."""
        f.paced = False
        beside = self._poc_streams.beside
        if to_beside and beside is not f.stream and not f.forward.is_queued:
            beside.wait_stream(f.stream)
            f.forward.record_stream(beside)
            f.stream, f.carveout = beside, self._poc_streams.carveout

    def _collecting(self, f: _InFlight):
        """Where f's artifacts are computed: after f, not on its stream, where the next forward may be queued (their
        one sync would wait for it too); their few kernels leave chat's alone."""
        if f.stream is None:
            return nullcontext()
        collect = self._poc_streams.collect if self._poc_streams is not None else self._poc_collect
        collect.wait_event(f.done)
        return torch.cuda.stream(collect)

    @staticmethod
    def _keep_output(f: _InFlight) -> None:
        """A replay's output is its graph's buffer, which the next replay (of any graph: they share a memory pool)
        overwrites: a forward launched behind `f` runs after a copy of it, taken on f's stream."""
        if isinstance(f.forward, graphs.GraphedForward) and not f.forward.is_copied:
            with torch.cuda.stream(f.stream):
                f.forward.last_hidden = f.forward.last_hidden.clone()
            f.forward.is_copied = True
            f.done = torch.cuda.Event()
            f.done.record(f.stream)

    @contextmanager
    def _on_poc_stream(self, stream, carveout: int):
        if stream is None or stream == torch.cuda.current_stream(stream.device):
            yield  # on chat's own stream (pipelined) the forward runs after chat's steps, sharing their workspace
            return
        with torch.cuda.stream(stream), compat.own_workspace(self), streams.cublas_carveout(carveout):
            yield


@dataclass
class _InFlight:
    """A forward launched beside chat, until poc_poll collects it."""

    forward: Any  # forward.LayerwiseForward, or graphs.GraphedForward for a replay
    stream: Any  # None off CUDA: the forward ran as it was queued
    carveout: int
    batch: ForwardBatch
    done: Any = None  # the CUDA event recorded after its last kernel
    paced: bool = False  # queued no further ahead of the GPU than pacing.AHEAD_S, on every SM, until chat runs


def _shape(batch: ForwardBatch) -> tuple[int, int]:
    """(sequences, seq_len): what a forward's graph and its pacing are kept by."""
    return len(batch.nonces), batch.spec.seq_len


def _artifacts(hidden: torch.Tensor, batch: ForwardBatch) -> list[tuple[int, str]]:
    spec: PocSpec = batch.spec
    return compute_artifacts(hidden, spec.block_hash, spec.public_key, list(batch.nonces), spec.k_dim)
