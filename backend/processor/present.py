"""EngineCoreOutputs → Deltas per frontend: vLLM's OutputProcessor (detokenizer, stop strings, logprobs), then
our wire shape. Owns the route of every request it prepared: which frontend and request id its deltas go to."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.metrics.stats import IterationStats

from backend.processor.outputs import to_delta
from backend.processor.stats import ChatStats
from protocol.generate import Delta


@dataclass
class Route:
    identity: bytes
    rid: str
    internal_id: str
    num_prompt_tokens: int
    num_top_logprobs: int
    num_generated: int = 0


class Presenter:
    def __init__(self, output_processor, tokenizer) -> None:
        self._outputs = output_processor
        self._tokenizer = tokenizer
        self.stats = ChatStats()
        # engine_rid (vLLM's external request id) → where its deltas go.
        self._routes: dict[str, Route] = {}
        self._by_internal: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._routes)

    def add(self, request: EngineCoreRequest, identity: bytes, rid: str, num_top_logprobs: int) -> None:
        self._outputs.add_request(request, None, None, 0)
        engine_rid = request.external_req_id
        self._routes[engine_rid] = Route(identity, rid, request.request_id, len(request.prompt_token_ids or ()),
                                         num_top_logprobs)
        self._by_internal[request.request_id] = engine_rid

    def forget(self, engine_rids: list[str]) -> None:
        """Drops requests the engine aborted (they get no final output)."""
        self._outputs.abort_requests(engine_rids, internal=False)
        for engine_rid in engine_rids:
            self._drop(engine_rid)

    def _drop(self, engine_rid: str) -> None:
        route = self._routes.pop(engine_rid, None)
        if route is not None:
            self._by_internal.pop(route.internal_id, None)

    def present(self, outputs: EngineCoreOutputs) -> tuple[dict[bytes, list[Delta]], list[str]]:
        """(deltas by frontend, engine_rids that stopped on a stop string: the engine must abort them)."""
        iteration_stats = IterationStats() if outputs.outputs else None
        processed = self._outputs.process_outputs(outputs.outputs, engine_core_timestamp=outputs.timestamp,
                                                  iteration_stats=iteration_stats)
        self._outputs.update_scheduler_stats(outputs.scheduler_stats)
        if iteration_stats is not None:
            self.stats.record(iteration_stats)
        # Stop strings are found here, not in the engine: its requests run on until the engine aborts them.
        stopped = [self._by_internal[i] for i in processed.reqs_to_abort if i in self._by_internal]
        by_frontend: dict[bytes, list[Delta]] = defaultdict(list)
        for out in processed.request_outputs:
            route = self._routes.get(out.request_id)
            if route is None:  # aborted after this step was scheduled
                continue
            delta = to_delta(out, route.num_prompt_tokens, route.num_generated, route.num_top_logprobs,
                             self._tokenizer)
            delta.rid = route.rid
            route.num_generated = delta.num_generated_tokens
            by_frontend[route.identity].append(delta)
            if out.finished:
                self._drop(out.request_id)
        return by_frontend, stopped
