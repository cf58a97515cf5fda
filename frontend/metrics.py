"""Prometheus metrics: this frontend's request counters and latencies, plus the backend's.

Three sources, one name each (no family appears twice):
- this frontend's registry: pocserve_http_*, latencies seen at the HTTP edge;
- the backend's latest stats (pongs): the PoC and link counters, and four vllm:* families from the engine thread
  (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:iteration_tokens_total),
  which count PoC forwards too and stay current while only PoC runs: the ML node's hang detector reads them;
- every other vllm:* family, rendered by vLLM's own stat logger in the backend's processor process
  (backend/processor/metrics.py), asked for on each scrape (routes/health.py).
The vllm:* series carry vLLM's labels (model_name, engine) and documentation, as `vllm serve` exports them.
"""

from __future__ import annotations

from time import monotonic

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from protocol.common import BackendStats, ProcessorStats, TokenHistogram

# vLLM's per-engine labels; engine is always "0" (one engine core per backend).
VLLM_LABELS = ["model_name", "engine"]
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class BackendCollector:
    def __init__(self, client) -> None:
        self._client = client

    def collect(self):
        stats: BackendStats | None = self._client.stats if self._client.is_alive else None
        up = GaugeMetricFamily("pocserve_backend_up", "1 while the backend counts as up: it answers pings, or it "
                               "is connected and busy (pocserve_backend_busy)")
        up.add_metric([], 1.0 if stats is not None else 0.0)
        yield up
        # A busy backend (frontend/liveness.py) holds its streams for up to --backend-busy-s: worth an alert of its
        # own, apart from down.
        liveness = self._client.liveness
        busy = GaugeMetricFamily("pocserve_backend_busy", "1 while the backend is connected but leaves pings "
                                 "unanswered; its streams and new requests wait, up to --backend-busy-s")
        busy.add_metric([], float(liveness.is_busy))
        yield busy
        for name, doc, value in (
            ("pocserve_backend_busy_spells", "Times the backend turned busy (connected, pings unanswered).",
             liveness.num_busy),
            ("pocserve_backend_busy_seconds", "Seconds the backend spent busy.", liveness.busy_seconds(monotonic())),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
        # This frontend's own view of the link, reported while the backend is down too (that is when it matters).
        direct = self._client.direct
        connected = GaugeMetricFamily("pocserve_frontend_direct_connected", "1 while this frontend's second "
                                      "connection, on which the backend's processor sends it deltas itself, is up")
        connected.add_metric([], float(direct is not None and direct.is_connected))
        yield connected
        handshakes = self._client.handshakes
        for name, doc, value in (
            ("pocserve_frontend_curve_refusals", "This frontend's CURVE handshakes the backend refused.",
             handshakes.num_refused if handshakes is not None else 0),
            ("pocserve_backend_malformed_replies", "Backend replies this frontend could not decode.",
             self._client.num_malformed_replies),
            ("pocserve_frontend_direct_messages", "Messages (deltas, replies) that came on the second connection.",
             direct.num_messages if direct is not None else 0),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
        if stats is None:
            return
        fingerprint = self._client.fingerprint
        labels = [fingerprint.served_model_name if fingerprint is not None else "", "0"]
        link, engine, poc, callbacks = stats.link, stats.engine, stats.poc, stats.callbacks
        # A part is absent until its owner first reports (the engine while it loads): its series are left out then.
        gauges = [("pocserve_engine_heartbeat_age_seconds", "Seconds since the engine loop last reported.",
                   link.engine_heartbeat_age_s)]
        counters = [
            ("pocserve_backend_rejected_frames", "Malformed frames the backend dropped.", link.num_rejected_frames),
            ("pocserve_backend_curve_refusals", "CURVE peers the backend refused (handshakes, revoked keys).",
             link.num_curve_refusals)]
        if engine is not None:
            for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", engine.num_running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engine.num_waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engine.kv_cache_usage),
            ):
                g = GaugeMetricFamily(name, doc, labels=VLLM_LABELS)
                g.add_metric(labels, float(value))
                yield g
            yield _iteration_tokens(engine.poc_iteration_tokens, stats.chat, labels)
            counters.append(("pocserve_backend_aborted_requests", "Requests aborted in the engine.",
                             engine.num_aborted_requests))
        if poc is not None:
            gauges += [("pocserve_poc_mining", "1 while a PoC mining round is active.", float(poc.is_mining)),
                       ("pocserve_poc_queued_job_nonces", "Nonces in queued /generate jobs.",
                        poc.num_queued_job_nonces)]
            counters += [("pocserve_poc_nonces", "PoC nonces computed (mining and jobs).", poc.num_nonces),
                         ("pocserve_poc_validations", "PoC validation jobs completed.", poc.num_validations)]
        if callbacks is not None:
            gauges.append(("pocserve_callback_backlog", "Callbacks waiting for delivery.", callbacks.backlog))
            counters += [
                ("pocserve_callbacks_delivered", "Callbacks delivered.", callbacks.num_delivered),
                ("pocserve_callbacks_dropped", "Callbacks dropped (retries exhausted or outbox full).",
                 callbacks.num_dropped),
                ("pocserve_callback_retries", "Callback attempts that failed and were retried.", callbacks.num_retries)]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c


def _iteration_tokens(poc: TokenHistogram, chat: ProcessorStats | None, labels: list[str]) -> HistogramMetricFamily:
    """vllm:iteration_tokens_total over every unit of device work: chat's steps (the processor counts them) and
    PoC's forwards (the engine thread does), on the same bounds."""
    counts, total = list(poc.counts), poc.sum
    if chat is not None:
        for i, n in enumerate(chat.iteration_tokens_counts[:len(counts)]):
            counts[i] += n
        total += chat.iteration_tokens_sum
    cumulative, buckets = 0, []
    for bound, count in zip([*poc.bounds, float("inf")], counts, strict=False):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    h = HistogramMetricFamily("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                              labels=VLLM_LABELS)
    h.add_metric(labels, buckets, sum_value=total)
    return h


class FrontendMetrics:
    def __init__(self, client) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("pocserve_http_requests", "HTTP API requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.e2e_latency = Histogram("pocserve_request_latency_seconds", "Request latency, end to end",
                                     ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("pocserve_time_to_first_token_seconds", "Time to the first generated token",
                              ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.backend_unavailable = Counter("pocserve_backend_unavailable", "Requests answered 503 for the backend",
                                           registry=self.registry)
        self.registry.register(BackendCollector(client))
