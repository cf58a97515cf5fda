"""The processor process's entry and loop: one thread serves the link to the engine process.

Spawned by the engine process (`start_processor`), it does what vLLM's API server does around its engine core,
without HTTP: chat templates and tokenizing in, detokenizing, stop strings and logprobs out, and it sends the
deltas straight to the frontends: on a socket of its own where a frontend connected to it (backend/processor/
direct.py), else through the engine process's io thread, which forwards them unread. So the
engine thread only steps the engine, as `vllm serve`'s engine process does, and the two never share a GIL. What the
engine thread sends comes on a socket of its own (`engine`), the rest on the link; each keeps its order.

It also answers /tokenize and /detokenize (TokenizeJob) and renders vLLM's own metrics for /metrics (MetricsJob),
sending the reply to the frontend as it sends deltas.

Only small requests are prepared or answered inline; the rest (long prompts: the tokenizer takes ~1.3 s per MB;
many messages: the chat template renders each; many ids) go to a helper thread, which posts the outcome back
through an inproc socket the loop polls. What is small is counted by backend/processor/cost.py.
"""

from __future__ import annotations

import queue
import threading
import time

import structlog
import zmq

from backend.errors import RequestError
from backend.processor import cost
from backend.processor.direct import DirectDeltas
from backend.processor.link import ProcessorSide
from backend.processor.tokenization import Tokenization
from common.sockets import make_socket
from protocol.codec import backend_codec
from protocol.common import ErrorInfo
from protocol.control import MetricsReply
from protocol.generate import DeltasEvent
from protocol.processor import (
    FORWARD,
    EngineBuilt,
    ForgetRequest,
    MetricsJob,
    Prepared,
    PrepareFailed,
    PrepareRequest,
    ProcessorReady,
    StopStringsHit,
    TokenizeJob,
)

log = structlog.get_logger(__name__)

# Chat statistics go to the engine process (for /metrics) at most this often.
_STATS_INTERVAL_S = 0.25


class Processor:
    """Serves the two sockets: PrepareRequest → Prepared/PrepareFailed, EngineCoreOutputs → deltas to frontends."""

    def __init__(self, ctx: zmq.Context, link: zmq.Socket, engine: zmq.Socket, preparer, presenter,
                 tokenizing: Tokenization, direct: DirectDeltas | None = None) -> None:
        self._link = link
        self._engine = engine
        self._direct = direct
        self._codec = ProcessorSide()
        self._frontend_codec = backend_codec()
        self._preparer = preparer
        self._presenter = presenter
        self._tokenizing = tokenizing
        # The helper thread: long prompts in, (request, outcome) out, a frame on `_wake` for each.
        self._long: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        wake_addr = f"inproc://processor-wake-{id(self):x}"
        self._wake = make_socket(ctx, zmq.PULL)
        self._wake.bind(wake_addr)
        threading.Thread(target=self._tokenize_long, args=(ctx, wake_addr), name="tokenize", daemon=True).start()
        self._stats_at = 0.0
        self._stats_count = -1

    def run(self, ready: ProcessorReady) -> None:
        self._link.send_multipart(self._codec.encode(ready))
        poller = zmq.Poller()
        poller.register(self._link, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        poller.register(self._engine, zmq.POLLIN)
        for sock in self._direct.sockets if self._direct is not None else ():
            poller.register(sock, zmq.POLLIN)
        while True:
            events = dict(poller.poll(100))
            if self._direct is not None:
                self._direct.on_events(events)
            if self._engine in events:
                self._on_message(self._codec.decode(self._engine.recv_multipart(copy=False)))
            if self._link in events:
                self._on_message(self._codec.decode(self._link.recv_multipart(copy=False)))
            if self._wake in events:
                self._wake.recv()
                self._finish_long(*self._done.get_nowait())
            self._publish_stats()

    def _on_message(self, msg) -> None:
        match msg:
            case PrepareRequest():
                if cost.inline(msg.request):
                    self._admit(msg, self._tokenize(msg))
                else:
                    self._long.put(msg)
            case TokenizeJob():
                if cost.inline(msg.request):
                    self._reply(msg, self._tokenize(msg))
                else:
                    self._long.put(msg)
            case ForgetRequest():
                self._presenter.forget(msg.engine_rids)
            case MetricsJob():
                self._reply(msg, MetricsReply(rid=msg.rid, text=self._presenter.metrics.render()))
            case EngineBuilt():
                self._preparer.engine_built(msg.max_model_len)
                self._presenter.metrics.engine_built(msg.num_gpu_blocks)
            case _:  # EngineCoreOutputs
                self._present(msg)

    def _tokenize(self, msg: PrepareRequest | TokenizeJob):
        if isinstance(msg, TokenizeJob):
            return self._tokenizing.answer(msg.request)
        try:
            return self._preparer.tokenize(msg.request)
        except Exception as e:  # reported by _admit, like an error in vLLM's own checks
            return e

    def _tokenize_long(self, ctx: zmq.Context, wake_addr: str) -> None:
        """The helper thread (it owns its end of the wake-up socket)."""
        wake = make_socket(ctx, zmq.PUSH)
        wake.connect(wake_addr)
        encoder = backend_codec()  # its own: the main thread's is not shared across threads
        while True:
            msg = self._long.get()
            outcome = self._tokenize(msg)
            if isinstance(msg, TokenizeJob):  # a reply of up to ~10^6 ids: encoded here, not on the main thread
                outcome = encoder.encode(outcome)
            self._done.put((msg, outcome))
            wake.send(b"")

    def _finish_long(self, msg: PrepareRequest | TokenizeJob, outcome) -> None:
        if isinstance(msg, TokenizeJob):
            self._to_frontend(msg.identity, outcome)
        else:
            self._admit(msg, outcome)

    def _reply(self, job: TokenizeJob | MetricsJob, reply) -> None:
        self._to_frontend(job.identity, self._frontend_codec.encode(reply))

    def _to_frontend(self, identity: bytes, payload) -> None:
        """One message, in no stream: directly where the frontend said Hello, else through the engine process."""
        direct = self._direct
        if direct is None or not direct.is_direct(identity) or not direct.send(identity, payload):
            self._link.send_multipart([FORWARD, identity, payload])

    def _admit(self, msg: PrepareRequest, tokenized) -> None:
        try:
            if isinstance(tokenized, Exception):
                raise tokenized
            engine = self._preparer.to_engine(msg.engine_rid, msg.request, tokenized)
        except RequestError as e:
            self._link.send_multipart(self._codec.encode(PrepareFailed(engine_rid=msg.engine_rid, error=e.info())))
            return
        except Exception as e:  # one request failed before reaching the engine; the process goes on
            log.exception("request_prepare_failed", rid=msg.request.rid)
            info = ErrorInfo(status=500, message=f"internal error: {e}", type="InternalServerError")
            self._link.send_multipart(self._codec.encode(PrepareFailed(engine_rid=msg.engine_rid, error=info)))
            return
        is_direct = self._direct is not None and self._direct.is_direct(msg.identity)
        self._presenter.add(engine, msg.identity, msg.request.rid, msg.request.sampling.logprobs or 0,
                            msg.request.stream, tokenized.parsing, is_direct=is_direct)
        reply = Prepared(engine_rid=msg.engine_rid, internal_ids=[r.request_id for r in engine.requests])
        self._link.send_multipart(self._codec.encode(reply, engine.requests))

    def _present(self, outputs) -> None:
        by_frontend, stopped = self._presenter.present(outputs)
        if by_frontend:
            frames = [FORWARD]
            for (identity, is_direct), deltas in by_frontend.items():
                payload = self._frontend_codec.encode(DeltasEvent(deltas=deltas))
                # A direct stream whose frontend is gone from here goes on through the engine process: that
                # frontend failed its streams when the connection dropped, so nothing it still reads is reordered.
                if not (is_direct and self._direct is not None and self._direct.send(identity, payload)):
                    frames += [identity, payload]
            if len(frames) > 1:
                self._link.send_multipart(frames, copy=False)
        if stopped:
            self._link.send_multipart(self._codec.encode(StopStringsHit(internal_ids=stopped)))

    def _publish_stats(self) -> None:
        now = time.monotonic()
        stats = self._presenter.stats
        if now - self._stats_at >= _STATS_INTERVAL_S and stats.iterations.count != self._stats_count:
            self._stats_at, self._stats_count = now, stats.iterations.count
            self._link.send_multipart(self._codec.encode(stats.snapshot()))
