"""EngineCoreOutputs → Deltas per frontend: vLLM's OutputProcessor (detokenizer, stop strings, logprobs, the n
choices of one request joined), the tool and reasoning parsers, then our wire shape. Owns the route of every
request it prepared: which frontend and request id its deltas go to."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import structlog
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import IterationStats

from backend.processor.metrics import VllmMetrics
from backend.processor.outputs import to_delta
from backend.processor.parsing import RequestParsing
from backend.processor.prepare import EngineRequests
from backend.processor.stats import ChatStats
from protocol.generate import Delta

log = structlog.get_logger(__name__)


@dataclass
class Route:
    identity: bytes
    rid: str
    # vLLM's internal ids of its engine requests, one per choice.
    internal_ids: list[str]
    num_prompt_tokens: int
    num_top_logprobs: int
    is_stream: bool
    parsing: RequestParsing | None = None
    # Its deltas go on the processor's own socket (backend/processor/direct.py), decided once when prepared.
    is_direct: bool = False
    # Choice index → tokens generated so far.
    num_generated: dict[int, int] = field(default_factory=dict)


class Presenter:
    def __init__(self, output_processor, tokenizer, metrics: VllmMetrics) -> None:
        self._outputs = output_processor
        self._tokenizer = tokenizer
        self.stats = ChatStats()
        self.metrics = metrics
        # engine_rid (vLLM's external request id) → where its deltas go.
        self._routes: dict[str, Route] = {}
        self._by_internal: dict[str, str] = {}
        self.num_parse_failures = 0

    def __len__(self) -> int:
        return len(self._routes)

    def add(self, engine: EngineRequests, identity: bytes, rid: str, num_top_logprobs: int, is_stream: bool,
            parsing: RequestParsing | None = None, *, is_direct: bool = False) -> None:
        for index, request in enumerate(engine.requests):
            self._outputs.add_request(request, None, engine.parent, index)
        first = engine.requests[0]
        engine_rid = first.external_req_id
        internal_ids = [r.request_id for r in engine.requests]
        self._routes[engine_rid] = Route(identity, rid, internal_ids, len(first.prompt_token_ids or ()),
                                         num_top_logprobs, is_stream, parsing, is_direct)
        for internal_id in internal_ids:
            self._by_internal[internal_id] = engine_rid

    def forget(self, engine_rids: list[str]) -> None:
        """Drops requests the engine aborted (they get no final output)."""
        self._outputs.abort_requests(engine_rids, internal=False)
        for engine_rid in engine_rids:
            self._drop(engine_rid)

    def _drop(self, engine_rid: str) -> None:
        route = self._routes.pop(engine_rid, None)
        if route is not None:
            for internal_id in route.internal_ids:
                self._by_internal.pop(internal_id, None)

    def present(self, outputs: EngineCoreOutputs) -> tuple[dict[tuple[bytes, bool], list[Delta]], list[str]]:
        """(deltas by frontend and path (is_direct), internal ids of the choices that stopped on a stop string: the
        engine must abort them)."""
        iteration_stats = IterationStats() if outputs.outputs else None
        processed = self._outputs.process_outputs(outputs.outputs, engine_core_timestamp=outputs.timestamp,
                                                  iteration_stats=iteration_stats)
        self._outputs.update_scheduler_stats(outputs.scheduler_stats)
        if iteration_stats is not None:
            self.stats.record(iteration_stats)
        self.metrics.record(outputs.scheduler_stats, iteration_stats)
        # Stop strings are found here, not in the engine: its requests run on until the engine aborts them.
        stopped = [i for i in processed.reqs_to_abort if i in self._by_internal]
        by_frontend: dict[tuple[bytes, bool], list[Delta]] = defaultdict(list)
        for out in processed.request_outputs:
            route = self._routes.get(out.request_id)
            if route is None:  # aborted after this step was scheduled
                continue
            for comp in out.outputs:
                delta = self._delta(route, comp)
                if delta is not None:
                    # Per engine output, as vllm serve reads them (its first output when streaming, its last one
                    # otherwise): the frontend picks the same one.
                    delta.num_cached_tokens = out.num_cached_tokens
                    delta.num_cache_creation_tokens = out.num_cache_creation_tokens
                    by_frontend[route.identity, route.is_direct].append(delta)
            if out.finished:
                self._drop(out.request_id)
        return by_frontend, stopped

    def _delta(self, route: Route, comp) -> Delta | None:
        delta = to_delta(comp, route.num_prompt_tokens, route.num_generated.get(comp.index, 0),
                         route.num_top_logprobs, self._tokenizer)
        delta.rid = route.rid
        route.num_generated[comp.index] = delta.num_generated_tokens
        if route.parsing is None:
            return delta
        try:
            if route.is_stream:
                parsed = route.parsing.delta(comp.index, delta.text, delta.token_ids, delta.finish_reason)
                if parsed is None:  # the parser holds this text back (a tool call's markup, say): nothing to send
                    return None
            else:
                parsed = route.parsing.whole(delta.text, delta.token_ids, delta.finish_reason)
        except Exception:
            # A parser bug must not take the processor (every stream) down: this request goes on unparsed.
            self.num_parse_failures += 1
            log.exception("output_parse_failed", rid=route.rid, num_failures=self.num_parse_failures)
            route.parsing = None
            return delta
        delta.text, delta.reasoning, delta.tool_calls = parsed.text, parsed.reasoning, parsed.tool_calls
        delta.finish_reason = parsed.finish_reason
        return delta
